"""The documentation: generated pages current, README short, every relative link resolving
inside the repository, and the site building with every warning an error."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MKDOCS = Path(sys.executable).parent / "mkdocs"
# [text](target) and ![alt](target), target up to a space or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _generator() -> ModuleType:
    sys.path.insert(0, str(DOCS))
    try:
        spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(DOCS))


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "examples" / "README.md",
            *sorted(DOCS.rglob("*.md"))]


def _code_stripped(text: str) -> str:
    """`text` without fenced code blocks and code spans (links in code are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def test_generated_pages_are_current() -> None:
    """The committed pages equal what docs/generate.py makes now: a CLI option, a rule, a
    chip key or a plan key that changed without `make docs` fails here."""
    pages = _generator().pages()
    assert "docs/cli.md" in pages and "docs/rules.md" in pages and "README.md" in pages
    stale = [path for path, text in pages.items()
             if not (ROOT / path).exists() or (ROOT / path).read_text() != text]
    assert not stale, f"stale generated pages (run `make docs`): {stale}"


def test_the_cli_reference_names_every_command() -> None:
    text = (DOCS / "cli.md").read_text()
    for command in ("solve", "verify", "compare", "explain", "inspect", "rules check",
                    "pareto", "partition", "table", "report", "export", "sweep", "check"):
        assert f"## fuseplan {command} " in text, command


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the manual lives in docs/"


@pytest.mark.parametrize("page", _markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve_inside_the_repository(page: Path) -> None:
    bad = []
    for target in LINK.findall(_code_stripped(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # an absolute URL or an anchor on the same page
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            bad.append(target)
    assert not bad, f"{page.relative_to(ROOT)}: links that do not resolve in the repository: {bad}"


def test_no_page_points_outside_the_repository() -> None:
    for page in _markdown_files():
        assert "../shared" not in page.read_text(), page.relative_to(ROOT)


def test_the_code_map_names_every_package() -> None:
    """docs/how/architecture.md's code map (the layering tests/test_architecture.py checks)
    has a row for every package, and no row for one that is gone."""
    text = (DOCS / "how" / "architecture.md").read_text()
    listed = set(re.findall(r"^\| `([\w/]+)/` \|", text, re.M))
    packages = {p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob("planner/*/__init__.py")}
    assert listed == packages | {"hardware", "rules", "solver", "emulator"}


def test_the_contract_lives_in_the_docs() -> None:
    text = (DOCS / "contract.md").read_text()
    assert "fuseplan solve MODEL" in text and "fuseplan_plan" in text


@pytest.mark.skipif(not MKDOCS.exists(), reason="mkdocs is not installed (pip install -e '.[dev]')")
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """`mkdocs build --strict` (a few seconds): every page in the nav, every link and anchor
    resolving."""
    done = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "cli.html").exists() and (tmp_path / "how" / "sweeps.html").exists()
