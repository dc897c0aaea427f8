"""docs/README.md links every page and example under docs/, and every relative link there resolves; the repository
cites nothing outside itself."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def test_the_docs_index_links_every_page_and_example():
    index = (DOCS / "README.md").read_text()
    links = set(re.findall(r"\]\(([^)#]+)", index))
    pages = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*") if path.suffix in (".md", ".py")}
    assert pages - {"README.md"} <= links, f"not in docs/README.md: {sorted(pages - links - {'README.md'})}"
    missing = [link for link in links if not (DOCS / link).exists()]
    assert missing == [], missing


def test_the_repository_cites_nothing_outside_itself():
    """No .py or .md file git tracks (or would add) cites a section of a document kept outside the repository.

    The strings are built from parts so that this file does not match them."""
    forbidden = ("\N{SECTION SIGN}", "shared/" + "reference", "lightning-2.6-" + "behaviour")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py", "*.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    found = [
        f"{name}:{number}"
        for name in listed
        if (ROOT / name).is_file()
        for number, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1)
        if any(text in line for text in forbidden)
    ]
    assert found == [], f"lines citing something outside the repository: {found}"
