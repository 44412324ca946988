"""The documentation's links lead somewhere, and the Python API reference names the whole client."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from sidecar.client import SidecarClient

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "examples" / "README.md",
         *sorted((ROOT / "editors").glob("*/README.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to what is not there: {broken}"


def test_the_api_reference_names_every_public_method_of_the_client() -> None:
    text = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    public = [name for name in vars(SidecarClient) if not name.startswith("_")]
    missing = [name for name in public if not re.search(rf"\b{name}\b", text)]
    assert not missing, f"docs/python-api.md does not document SidecarClient.{', .'.join(missing)}"


def test_the_readme_s_documentation_table_lists_every_page_of_docs() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| \[docs/([\w.-]+\.md)\]\(docs/\1\) \|", table, flags=re.M))
    assert listed == {page.name for page in (ROOT / "docs").glob("*.md")}


def test_the_vs_code_install_commands_name_what_the_build_makes() -> None:
    package = json.loads((ROOT / "editors" / "vscode" / "package.json").read_text(encoding="utf-8"))
    vsix = f"{package['name']}-{package['version']}.vsix"  # what `vsce package` names it
    for readme in (ROOT / "README.md", ROOT / "editors" / "vscode" / "README.md"):
        text = readme.read_text(encoding="utf-8")
        assert "scripts/install-vscode.sh" in text and f"code --install-extension {vsix}" in text, readme
    script = ROOT / "scripts" / "install-vscode.sh"
    assert os.access(script, os.X_OK) and "install-vscode.sh" in (ROOT / "editors" / "vscode" / "e2e" /
                                                                  "run.sh").read_text(), "CI builds it that way"


def test_the_readme_is_short_and_starts_with_use() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[:2] == ["Install", "An agent on the Python client"]
    assert len(text.splitlines()) <= 357


def test_the_vs_code_readme_names_the_extension_by_its_id() -> None:
    package = json.loads((ROOT / "editors" / "vscode" / "package.json").read_text(encoding="utf-8"))
    readme = (ROOT / "editors" / "vscode" / "README.md").read_text(encoding="utf-8")
    ids = re.findall(r"getExtension\('([^']+)'\)", readme)
    assert ids and set(ids) == {f"{package['publisher']}.{package['name']}"}


@pytest.mark.parametrize("editor", ["neovim", "vscode", "pi"])
def test_the_editor_readmes_set_up_the_database_agents_use(editor: str) -> None:
    readme = (ROOT / "editors" / editor / "README.md").read_text(encoding="utf-8")
    code = "\n".join(re.findall(r"^```\w*\n(.*?)^```", readme, flags=re.S | re.M))
    assert "--db" not in code, "an editor with a database of its own does not see the agents' sessions"
    assert "pipx install ." in readme, "the README does not say how to put context-sidecar on PATH"
