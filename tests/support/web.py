"""Signing in to the web app from a test: the reviewer accounts' passwords and the CSRF
token every form post needs (read from the page's meta tag, as the browser does)."""
from __future__ import annotations

import re

PASSWORD = "correct horse battery"  # the web tests' reviewer
BROWSER_REVIEWER = "browser-reviewer"
BROWSER_PASSWORD = "correct horse battery staple"
_META_CSRF = re.compile(r'<meta name="csrf-token" content="([^"]+)">')


def csrf_token(client, path: str = "/upload/") -> str:
    page = client.get(path)
    match = _META_CSRF.search(page.get_data(as_text=True))
    assert match, f"no CSRF token on {path} ({page.status_code})"
    return match.group(1)


def login(client, username: str, password: str = PASSWORD):
    token = csrf_token(client, "/auth/login")
    return client.post("/auth/login", data={"username": username, "password": password, "csrf_token": token})


_VERSION = re.compile(r'<input type="hidden" name="version" value="(\d+)"')


def review_version(client, result_id: int) -> str:
    """The review version a result's page carries in its form (what the reviewer's post sends)."""
    match = _VERSION.search(client.get(f"/review/results/{result_id}").get_data(as_text=True))
    assert match, f"no review version on result {result_id}'s page"
    return match.group(1)


def sign_in(page, base: str, name: str = BROWSER_REVIEWER, password: str = BROWSER_PASSWORD) -> None:
    """A browser page signs in through the form, as a reviewer does; returns on the first
    signed-in page."""
    page.goto(f"{base}/auth/login")
    page.fill("#username", name)
    page.fill("#password", password)
    page.click("[data-testid=login-submit]")
    page.wait_for_selector("[data-testid=nav-results]")


# page.evaluate(SPLIT_TOKENS, "selector of the parts to check"): each token in their table
# cells (a run without spaces, hyphens or slashes, after which lines may break) whose text
# lands on two lines ("Resu lts", "1002 0"): a table that breaks words. Empty when none does.
SPLIT_TOKENS = """(roots) => {
  const split = [];
  const cells = [...document.querySelectorAll(roots)].flatMap(root => [...root.querySelectorAll("th, td")]);
  for (const cell of cells) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.data.matchAll(/[^\\s\\-\u2013\\/]+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const lines = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
        if (lines.size > 1) split.push(m[0] + " in " + (cell.closest("table").dataset.testid || "a table"));
      }
    }
  }
  return split;
}"""
