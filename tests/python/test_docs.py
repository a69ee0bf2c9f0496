"""The README and docs/ link to each other: every relative link names a file that exists,
and every #anchor a heading in it (GitHub's anchor rules), so the map in the README and
the cross-references between topics cannot rot silently. And the README stays short
enough for a newcomer to read (the rest belongs in docs/)."""

import re
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"```.*?```", re.S)


def slug(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    seen, found = {}, set()
    for m in re.finditer(r"^#{1,6} (.+?)\s*#*$", text, re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        found.add(s if n == 0 else f"{s}-{n}")
    return found | set(re.findall(r'<a id="([^"]+)"', text))


def pages():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_and_anchor_resolves():
    broken, checked = [], 0
    for page in pages():
        text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text(encoding="utf-8")))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            dest = (page.parent / urllib.parse.unquote(path)).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert checked > 100
    assert broken == []


def test_each_topic_links_back_and_the_readme_maps_it():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in pages()[1:]:
        assert "../README.md" in page.read_text(encoding="utf-8"), f"{page.name} links back"
        assert f"docs/{page.name}" in readme, f"the README's map names {page.name}"
    assert len(readme.splitlines()) <= 250
