"""Install hints: the pip command printed for a missing extra must work for the way ragsuite was installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragsuite import errors
from ragsuite.errors import MissingExtraError, install_hint, require


def _installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, direct_url: str | None) -> None:
    """ragsuite as pip lays it out in site-packages: the package beside its metadata folder, which holds a
    direct_url.json unless it came from an index."""
    site = tmp_path / "site-packages"
    (site / "ragsuite").mkdir(parents=True)
    (site / "ragsuite-0.1.0.dist-info").mkdir()
    (site / "ragsuite-0.1.0.dist-info" / "METADATA").write_text("Name: ragsuite\n")
    if direct_url is not None:
        (site / "ragsuite-0.1.0.dist-info" / "direct_url.json").write_text(direct_url)
    monkeypatch.setattr(errors, "_package_dir", lambda: site / "ragsuite")


def test_index_install_gets_the_package_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _installed(monkeypatch, tmp_path, None)
    assert install_hint("vllm") == "pip install 'ragsuite[vllm]'"


@pytest.mark.parametrize(
    "direct_url",
    [
        '{"dir_info": {"editable": true}, "url": "file:///home/me/ragsuite"}',
        '{"dir_info": {}, "url": "file:///home/me/ragsuite"}',
        '{"url": "https://example.org/ragsuite.tar.gz", "archive_info": {}}',
    ],
)
def test_clone_or_url_install_gets_the_clone_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, direct_url: str
) -> None:
    _installed(monkeypatch, tmp_path, direct_url)
    assert install_hint("colbert") == "pip install -e '.[colbert]' (from the ragsuite clone)"


def test_uninstalled_clone_gets_the_clone_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "ragsuite").mkdir()  # a clone: no metadata folder beside the package
    monkeypatch.setattr(errors, "_package_dir", lambda: tmp_path / "ragsuite")
    assert install_hint("dense") == "pip install -e '.[dense]' (from the ragsuite clone)"


def test_missing_extra_error_uses_the_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _installed(monkeypatch, tmp_path, '{"dir_info": {"editable": true}, "url": "file:///x"}')
    with pytest.raises(MissingExtraError) as info:
        require("ragsuite_no_such_module", extra="plot", feature="Plotting")
    message = str(info.value)
    assert "Plotting needs the 'ragsuite_no_such_module' package" in message
    assert message.endswith("Install it with: pip install -e '.[plot]' (from the ragsuite clone)")
    assert "ragsuite[plot]" not in message


def test_this_checkout_gets_the_clone_command() -> None:
    """The tests run from a clone (editable install or none): no metadata beside its package folder."""
    assert install_hint("plot") == "pip install -e '.[plot]' (from the ragsuite clone)"
