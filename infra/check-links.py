#!/usr/bin/env python3
"""Link check of the project's Markdown.

Walks every *.md file of the repository (but target/, .venv*/, node_modules/, .local/ and .git/) and
checks every relative link and image: its file (or directory) exists, and its `#anchor`, in the same
file or in another Markdown file, is the GitHub slug of one of that file's headings (or an explicit
`id`/`name` anchor). Links to http(s), mailto and other schemes are not followed. Then checks that
every page under docs/ is reachable by links from the index, docs/README.md, through docs/ pages, and
that README.md links to the index. Exits 1 with one line per broken link, 0 otherwise.
Standard library only.
"""
import os
import re
import sys
from urllib.parse import unquote

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
INDEX = os.path.join("docs", "README.md")
SKIP_DIRS = {"target", "node_modules", ".local", ".git"}

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# An inline link or image: [text](destination "title"), the text possibly holding one level of
# brackets and line breaks.
INLINE = re.compile(
    r"(!?)\[((?:[^\[\]\\]|\\.|\[(?:[^\[\]\\]|\\.)*\])*)\]"
    r"\(\s*(<[^>\n]*>|[^\s()<>]*(?:\([^\s()]*\)[^\s()<>]*)*)"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
REFERENCE_DEF = re.compile(r"^ {0,3}\[([^\]]+)\]:[ \t]*<?([^\s>]+)>?", re.M)
HTML_ATTR = re.compile(r"<(?:a|img|source)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']*)[\"']", re.I)
HTML_ANCHOR = re.compile(r"<[a-z][^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
COMMENT = re.compile(r"<!--.*?-->", re.S)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files():
    """Every *.md file under the root, as paths relative to it, sorted."""
    found = []
    for directory, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(
            d for d in dirs if d not in SKIP_DIRS and not d.startswith(".venv")
        )
        for name in files:
            if name.endswith(".md"):
                found.append(os.path.relpath(os.path.join(directory, name), ROOT))
    return sorted(found)


def without_code(text):
    """The text with fenced code blocks emptied, and inline code spans and HTML comments blanked
    out (line breaks kept, so line numbers stay the same), and its lines with fenced code emptied."""
    lines = text.split("\n")
    out = []
    fence = None
    for line in lines:
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            out.append("")
        elif fence is not None:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) \
                    and not line.strip()[len(match.group(1)):].strip():
                fence = None
            out.append("")
        else:
            out.append(line)
    prose = "\n".join(out)
    prose = COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose)
    return blank_code_spans(prose), out


def blank_code_spans(text):
    """Replaces inline code spans (a run of N backticks up to the next run of exactly N) by spaces."""
    result = []
    i = 0
    n = len(text)
    while i < n:
        if text[i] != "`":
            result.append(text[i])
            i += 1
            continue
        j = i
        while j < n and text[j] == "`":
            j += 1
        run = j - i
        k = j
        close = -1
        while k < n:
            if text[k] == "`":
                m = k
                while m < n and text[m] == "`":
                    m += 1
                if m - k == run:
                    close = k
                    break
                k = m
            else:
                k += 1
        if close < 0:
            result.append(text[i:j])
            i = j
            continue
        end = close + run
        result.append(re.sub(r"[^\n]", " ", text[i:end]))
        i = end
    return "".join(result)


def heading_text(raw):
    """The rendered text of a heading's Markdown: links and images by their text, no code marks,
    no HTML tags, no emphasis marks."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = re.sub(r"!?\[([^\]]*)\]\[[^\]]*\]", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "")
    text = re.sub(r"\*+", "", text)
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)
    return text.strip()


def slug(text):
    """GitHub's anchor for a heading's text: lower case, every character but letters, digits,
    underscores, hyphens and spaces dropped, each space a hyphen."""
    text = heading_text(text).lower()
    text = "".join(c for c in text if c.isalnum() or c in "_- ")
    return text.replace(" ", "-")


def anchors(path, cache={}):
    """Every anchor of a Markdown file: its headings' slugs (duplicates numbered as GitHub numbers
    them) and its explicit HTML ids and names."""
    if path in cache:
        return cache[path]
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    _, lines = without_code(text)
    seen = {}
    found = set()

    def add(base):
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")

    previous = ""
    for line in lines:
        atx = ATX.match(line)
        if atx:
            add(slug(atx.group(2) or ""))
            previous = ""
            continue
        setext = SETEXT.match(line)
        if setext and previous.strip() and not re.match(r"^ {0,3}([-*+>|#]|\d+[.)])", previous):
            add(slug(previous.strip()))
            previous = ""
            continue
        previous = line
    for name in HTML_ANCHOR.findall(COMMENT.sub("", text)):
        found.add(name)
    cache[path] = found
    return found


def links(path):
    """Every (line, destination) of a Markdown file's links, images and HTML href/src attributes,
    outside code and comments."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    prose, _ = without_code(text)
    found = []

    def line_of(offset):
        return prose.count("\n", 0, offset) + 1

    for match in INLINE.finditer(prose):
        destination = match.group(3)
        if destination.startswith("<") and destination.endswith(">"):
            destination = destination[1:-1]
        found.append((line_of(match.start()), destination))
    for match in REFERENCE_DEF.finditer(prose):
        found.append((line_of(match.start()), match.group(2)))
    for match in HTML_ATTR.finditer(prose):
        found.append((line_of(match.start()), match.group(1)))
    return found


def resolve(source, destination):
    """(target path relative to the root, or None for the same file; anchor or None) of a relative
    destination, or None when the destination is not checked (another scheme, or empty)."""
    if not destination or SCHEME.match(destination) or destination.startswith("//"):
        return None
    target, _, anchor = destination.partition("#")
    target = unquote(target.split("?", 1)[0])
    anchor = unquote(anchor) if anchor else None
    if not target:
        return None, anchor
    if target.startswith("/"):
        full = os.path.join(ROOT, target.lstrip("/"))
    else:
        full = os.path.join(ROOT, os.path.dirname(source), target)
    return os.path.relpath(os.path.normpath(full), ROOT), anchor


def main():
    files = markdown_files()
    broken = []
    checked = 0
    graph = {}
    for path in files:
        graph[path] = set()
        for line, destination in links(path):
            resolved = resolve(path, destination)
            if resolved is None:
                continue
            checked += 1
            target, anchor = resolved
            where = f"{path}:{line}: ({destination})"
            if target is None:
                target = path
            else:
                full = os.path.join(ROOT, target)
                if not os.path.exists(full):
                    broken.append(f"{where}: {target} does not exist")
                    continue
                if target.endswith(".md") and os.path.isfile(full):
                    graph[path].add(target)
            if anchor and target.endswith(".md") and os.path.isfile(os.path.join(ROOT, target)):
                if anchor not in anchors(target):
                    broken.append(f"{where}: no heading or anchor #{anchor} in {target}")

    if INDEX not in graph:
        broken.append(f"{INDEX}: the documentation's index does not exist")
    else:
        pages = {p for p in files if p.startswith("docs" + os.sep)}
        reached = {INDEX}
        queue = [INDEX]
        while queue:
            page = queue.pop()
            for target in graph.get(page, ()):
                if target in pages and target not in reached:
                    reached.add(target)
                    queue.append(target)
        for page in sorted(pages - reached):
            broken.append(f"{page}: not reachable by links from {INDEX}")
    if "README.md" in graph and INDEX not in graph["README.md"]:
        broken.append(f"README.md: does not link to {INDEX}")

    if broken:
        print(f"check-links: {len(broken)} broken in {len(files)} Markdown files:", file=sys.stderr)
        for problem in broken:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print(f"check-links: {checked} relative links in {len(files)} Markdown files, all resolve; "
          f"every page under docs/ is reachable from {INDEX}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
