"""docs/README.md links every page and example under docs/, and every relative link there resolves."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_docs_index_links_every_page_and_example():
    index = (DOCS / "README.md").read_text()
    links = set(re.findall(r"\]\(([^)#]+)", index))
    pages = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*") if path.suffix in (".md", ".py")}
    assert pages - {"README.md"} <= links, f"not in docs/README.md: {sorted(pages - links - {'README.md'})}"
    missing = [link for link in links if not (DOCS / link).exists()]
    assert missing == [], missing
