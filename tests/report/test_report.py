"""The HTML report, opened from file:// in a real headless Chromium: tree, details, search, profile, compare."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from modelexport.inspect.analyze import analyze
from modelexport.inspect.extract import module_boundary
from modelexport.inspect.loading import load_tagged_model
from modelexport.inspect.profile import ProfileConfig
from modelexport.inspect.report import ReportConfig, write_report

TOP_LEVEL = ["BertEmbeddings", "BertEncoder", "BertPooler"]


def _names(driver: Any, css: str) -> list[str]:
    return [e.text for e in driver.find_elements("css selector", css) if e.is_displayed()]


def _children_css(tag: str) -> str:
    return f".tree-row[data-tag='{tag}'] + ul > li > .tree-row .mname"


@pytest.fixture(scope="module")
def bert_page(tiny_bert_export: Any, tiny_bert_int8: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    cfg = ReportConfig(ProfileConfig(runs=2), str(tiny_bert_int8), numeric=True, error_report=True)
    return write_report(tiny_bert_export.onnx_path, tmp_path_factory.mktemp("r") / "bert.html", cfg)


@pytest.mark.integration
def test_page_is_self_contained(bert_page: Any) -> None:
    page = bert_page[0].read_text(encoding="utf-8")
    assert not re.search(r"(src|href)\s*=\s*[\"'](https?:)?//", page), "the page must not load anything"
    assert '<link rel="stylesheet"' not in page and "url(" not in page
    assert page.count("<script") == 2  # the data and our own script, both inline


@pytest.mark.integration
def test_tiny_bert_tree_details_and_search(browser: Any, bert_page: Any, tiny_bert_export: Any) -> None:
    path, data = bert_page
    assert open_errors(browser, path) == []
    assert _names(browser, "#tree > li > .tree-row .mname") == ["BertModel"]
    assert _names(browser, _children_css("/BertModel")) == TOP_LEVEL
    encoder = "/BertModel/BertEncoder"
    assert _names(browser, _children_css(encoder)) == []  # collapsed until expanded
    browser.find_element("css selector", f".tree-row[data-tag='{encoder}'] .twisty").click()
    assert _names(browser, _children_css(encoder)) == ["BertLayer.0", "BertLayer.1"]

    layer = encoder + "/BertLayer.0"
    browser.find_element("css selector", f".tree-row[data-tag='{layer}']").click()
    details = browser.find_element("css selector", "#details")
    assert details.get_attribute("data-tag") == layer
    tm = load_tagged_model(tiny_bert_export.onnx_path, weights=False)
    expected = module_boundary(tm.proto, tm.index, layer)
    shown = [e.text for e in details.find_elements("css selector", "ul.tensors li")]
    assert shown == expected["inputs"] + expected["outputs"]
    stats = next(s for s in analyze(tiny_bert_export.onnx_path).modules if s.tag == layer)
    assert (
        f"0 / {stats.total_nodes}" in details.text or f"{stats.nodes} / {stats.total_nodes}" in details.text
    )

    search = browser.find_element("css selector", "#search")
    search.send_keys("Pooler")
    visible = [
        r.get_attribute("data-tag")
        for r in browser.find_elements("css selector", ".tree-row[data-tag]")
        if r.is_displayed()
    ]
    assert visible == ["/BertModel", "/BertModel/BertPooler"]
    search.clear()
    search.send_keys(" ")  # an empty query shows the whole tree again
    assert len(_names(browser, _children_css("/BertModel"))) == 3


@pytest.mark.integration
def test_profile_compare_and_error_sections(browser: Any, bert_page: Any) -> None:
    path, data = bert_page
    assert open_errors(browser, path) == []
    cells = browser.find_elements("css selector", "#icicle rect.icicle-cell")
    assert len(cells) == len(data["profile"]["modules"]) > 5
    assert {c.get_attribute("data-tag") for c in cells} == {m["tag"] for m in data["profile"]["modules"]}
    widths = {c.get_attribute("data-tag"): float(c.get_attribute("width")) for c in cells}
    assert widths["/BertModel"] == pytest.approx(1000.0)  # the root spans the chart: total = all module time
    assert len(
        browser.find_elements("css selector", "#profile table")[0].find_elements("css selector", "tbody tr")
    ) == len(data["profile"]["top_nodes"])
    rows = browser.find_elements("css selector", "#compare tr.compare-row")
    assert len(rows) == len(data["compare"]["modules"])
    changed = {r.get_attribute("data-tag") for r in rows if "changed" in r.get_attribute("class")}
    assert "/BertModel/BertEncoder" in changed  # int8 weights are smaller
    boundary = {
        r.get_attribute("data-tag"): r.find_elements("css selector", "td")[-1].text for r in rows
    }  # the error each module hands on, from running both models with its boundary exposed
    for tag, d in data["compare"]["module_numeric"].items():
        assert float(boundary[tag]) == pytest.approx(d["max_abs"], rel=1e-2)
    assert 0 < data["compare"]["module_numeric"]["/BertModel/BertEncoder"]["max_abs"] < 1
    assert len(browser.find_elements("css selector", "#errors tr.error-row")) == len(data["error_report"]) > 0


@pytest.mark.integration
def test_minilm_tree(browser: Any, minilm_export: Any, tmp_path: Path) -> None:
    path, data = write_report(minilm_export.onnx_path, tmp_path / "minilm.html")
    assert open_errors(browser, path) == []
    assert _names(browser, _children_css("/BertModel")) == TOP_LEVEL
    browser.find_element("css selector", ".tree-row[data-tag='/BertModel/BertEncoder'] .twisty").click()
    assert _names(browser, _children_css("/BertModel/BertEncoder")) == [f"BertLayer.{i}" for i in range(6)]


def open_errors(browser: Any, path: Path) -> list[dict[str, Any]]:
    from tests.report.browser import open_page

    return open_page(browser, path)
