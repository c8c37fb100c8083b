"""Page rendering: the synchronous Python work a request does between its awaits.

Real work, not a sleep: escaping and joining HTML, counting words for a "trending" box, digesting blobs
and encoding the page's state as JSON. ``scale`` multiplies the work, so CPU cost is a knob
(1.0 costs a few milliseconds for an index page on a typical machine).
"""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Sequence

from examples.forum.db import Post

__all__ = ["assemble_index", "render_index", "render_post"]


def _snippet(text: str, words: int) -> str:
    return " ".join(text.split()[:words])


def _trending(posts: Sequence[Post], rounds: int) -> list[tuple[str, int]]:
    counts: Counter[str] = Counter()
    for _ in range(rounds):
        for post in posts:
            for word in post.body.lower().split():
                if len(word) > 3:
                    counts[word] += 1
    return counts.most_common(8)


def _blob_digest(blob: bytes) -> int:
    # A rolling checksum in Python, as a thumbnailing or sanitising step would be.
    digest = 0
    for b in blob[:256]:
        digest = (digest * 31 + b) & 0xFFFFFFFF
    return digest


def _rounds(scale: float, base: int) -> int:
    return max(0, round(base * scale))


def render_index(
    page: int,
    posts: Sequence[Post],
    blobs: Sequence[bytes],
    top_users: Sequence[tuple[str, int]],
    tags: Sequence[tuple[str, int]],
    comment_counts: Sequence[int],
    scale: float = 1.0,
) -> str:
    """The index page's HTML (without the per-user boxes, which :func:`assemble_index` adds)."""
    rounds = _rounds(scale, 8)
    rows = []
    for _ in range(max(1, rounds)):
        rows = [
            f'<article id="post-{p.id}"><h2>{html.escape(p.title)}</h2>'
            f"<p class=by>{html.escape(p.author)} &middot; {n} comments &middot; blob {_blob_digest(b):08x}</p>"
            f"<p>{html.escape(_snippet(p.body, 40))}&hellip;</p></article>"
            for p, b, n in zip(posts, blobs, comment_counts, strict=True)
        ]
    trending = _trending(posts, rounds)
    state = json.dumps(
        {"page": page, "posts": [p.id for p in posts], "users": list(top_users), "tags": list(tags),
         "trending": trending, "sizes": [len(b) for b in blobs]},
        sort_keys=True,
    )
    side = "".join(f"<li>{html.escape(name)} ({n})</li>" for name, n in top_users)
    cloud = " ".join(f'<a class="tag w{min(n, 9)}">{html.escape(tag)}</a>' for tag, n in tags)
    return (
        f"<!doctype html><html><head><title>forum: page {page}</title></head><body>"
        f"<main>{''.join(rows)}</main><aside><ul>{side}</ul><div>{cloud}</div>"
        f"<!--personal--></aside><script type=application/json id=state>{html.escape(state)}</script>"
        f"</body></html>"
    )


def assemble_index(page_html: str, recommended: Sequence[int], ad: str | None, views: int | None = None) -> str:
    """Splice the per-user boxes (recommendations, ad) into a rendered or cached index page."""
    recs = "".join(f'<li><a href="/post/{pid}">post {pid}</a></li>' for pid in recommended)
    ad_html = f"<div class=ad>{html.escape(ad)}</div>" if ad is not None else "<div class=ad-fallback></div>"
    return page_html.replace("<!--personal-->", f"<ol class=recommended>{recs}</ol>{ad_html}", 1)


def render_post(post: Post, blob: bytes, scale: float = 1.0) -> str:
    """A post's page."""
    rounds = _rounds(scale, 24)
    words = _trending([post], rounds)
    paragraphs = "".join(f"<p>{html.escape(s.strip())}.</p>" for s in post.body.split(" the ") if s.strip())
    return (
        f"<!doctype html><html><head><title>{html.escape(post.title)}</title></head><body>"
        f"<article><h1>{html.escape(post.title)}</h1><p class=by>{html.escape(post.author)}</p>{paragraphs}"
        f"<p class=blob>{len(blob)} bytes, digest {_blob_digest(blob):08x}</p>"
        f"<ul>{''.join(f'<li>{html.escape(w)}</li>' for w, _ in words)}</ul></article></body></html>"
    )
