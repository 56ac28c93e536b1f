"""A real headless Chromium (Debian's package, driven by Selenium through Debian's chromedriver)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
DRIVER_NAMES = ("chromedriver",)


def find(names: tuple[str, ...]) -> str | None:
    return next((p for n in names if (p := shutil.which(n))), None)


def missing_reason() -> str | None:
    """Why no browser can run here (``make`` installs Chromium; this names what is still missing)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install 'modelexport[report]')"
    if find(CHROMIUM_NAMES) is None or find(DRIVER_NAMES) is None:
        return "Chromium or chromedriver not found (apt-get install chromium chromium-driver; `make` does it)"
    return None


def start_browser(scratch: Path, width: int = 1400, height: int = 1000) -> Any:
    """A headless Chromium whose temporary files go to ``scratch`` (its ``TMPDIR``): Chromium leaves a
    folder of its process-singleton socket in the temporary directory at every quit, which the caller
    deletes with ``scratch``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = find(CHROMIUM_NAMES)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(find(DRIVER_NAMES), env={**os.environ, "TMPDIR": str(scratch)})
    return webdriver.Chrome(options=options, service=service)


def open_page(driver: Any, path: Path) -> list[dict[str, Any]]:
    """Load ``path`` from ``file://``, wait until the script finished; returns the console's errors."""
    import time

    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(Path(path).resolve().as_uri())
    logs: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        logs += driver.get_log("browser")
        if driver.execute_script("return document.body.dataset.ready === 'true'") or any(
            e["level"] == "SEVERE" for e in logs
        ):
            break
        time.sleep(0.1)
    logs += driver.get_log("browser")
    return [e for e in logs if e["level"] in ("SEVERE", "WARNING")]
