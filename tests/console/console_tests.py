"""The web console in a real browser (issue #23), driven by tests/tests/console.rs.

Usage: console_tests.py NAME BASE_URL ARTIFACTS_DIR ARGS...

Headless Debian chromium (CHROMIUM names it) through Playwright. Every wait
has a timeout; a failed check raises, printing what the page showed. Lines
starting with "OUT " are results the Rust side checks; "PASSED NAME" ends a
test that ran to its end.
"""

import os
import re
import sys
from datetime import datetime, timezone

from playwright.sync_api import sync_playwright, expect

WAIT_MS = 20_000


def rate_is_positive(text):
    """A rate card's text ('12.3/s', '1.2k/s') is above zero."""
    m = re.match(r"^([0-9.]+)([kMG]?)/s$", text.strip())
    return bool(m) and float(m.group(1)) > 0


def open_page(p, base):
    browser = p.chromium.launch(
        executable_path=os.environ["CHROMIUM"],
        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        timeout=WAIT_MS,
    )
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id="UTC")
    page = ctx.new_page()
    page.set_default_timeout(WAIT_MS)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(base + "/")
    return browser, page, errors


def shot(page, artifacts, name, full=False):
    path = os.path.join(artifacts, f"{name}.png")
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=path, full_page=full)
    print(f"OUT screenshot {path}", flush=True)


def topic_hash(topic):
    m = re.match(r"^(persistent)://([^/]+)/([^/]+)/(.+)$", topic)
    return f"#/topic/{m.group(1)}/{m.group(2)}/{m.group(3)}/{m.group(4)}"


def wait_rate(page, selector, what):
    """Waits until the card under `selector` shows a rate above zero."""
    for _ in range(WAIT_MS // 250):
        text = page.locator(selector).inner_text()
        if rate_is_positive(text):
            print(f"OUT {what} {text}", flush=True)
            return
        page.wait_for_timeout(250)
    raise AssertionError(f"{what} stayed at {page.locator(selector).inner_text()!r}")


def test_workload(page, base, artifacts, topic, sub, consumer, key):
    # Overview: the topic among its shard's topics, produce and consume above zero.
    expect(page.locator("#overview-topics")).to_contain_text(topic)
    wait_rate(page, "#overview-cards .rate-in .value", "overview produce")
    wait_rate(page, "#overview-cards .rate-out .value", "overview consume")
    expect(page.locator("#shards-table tbody tr")).not_to_have_count(0)
    shot(page, artifacts, "overview")

    # Topics: listed with its figures; the search narrows the page.
    page.goto(base + "/#/topics")
    expect(page.locator("#topics-table")).to_contain_text(topic)
    shot(page, artifacts, "topics")
    local = topic.rsplit("/", 1)[1]
    page.fill("#topic-search", local)
    expect(page.locator("#topic-count")).to_contain_text(f"matching “{local}”")
    rows = page.locator("#topics-table tbody tr")
    expect(rows.first).to_contain_text(topic)
    print(f"OUT search rows {rows.count()}", flush=True)
    # Create a partitioned topic from the page.
    page.fill("#create-namespace", "public/default")
    page.fill("#create-name", "console-created")
    page.fill('#create-topic input[name="partitions"]', "3")
    page.click("#create-topic button[type=submit]")
    expect(page.locator("#notice")).to_have_text(re.compile(r"^Done: create persistent://public/default/console-created with 3 partitions"))
    print("OUT created console-created", flush=True)

    # Tenants and namespaces with their policies.
    page.goto(base + "/#/tenants")
    expect(page.locator('.namespace[data-namespace="public/default"] table.policies')).to_contain_text("Message TTL")
    shot(page, artifacts, "tenants")
    # Change a policy that can expire messages: it asks first.
    ns = page.locator('.namespace[data-namespace="public/default"]')
    ns.locator('select[name="policy"]').select_option("messageTTL")
    ns.locator('input[name="value"]').fill("3600")
    ns.locator(".policy-form button[type=submit]").click()
    expect(page.locator("#confirm-dialog")).to_be_visible()
    page.click("#confirm-ok")
    expect(page.locator("#notice")).to_have_text(re.compile(r"^Done: set messageTTL of public/default"))
    expect(page.locator('.namespace[data-namespace="public/default"] table.policies')).to_contain_text("3600 s")
    print("OUT ttl set", flush=True)

    # The topic: its subscription with its type, its consumer, live rates.
    page.goto(base + "/" + topic_hash(topic))
    row = page.locator(f'#subscriptions-table tr[data-subscription="{sub}"]')
    expect(row).to_be_visible()
    print(f"OUT subscription type {row.locator('.sub-type').inner_text()}", flush=True)
    expect(page.locator(f'#consumers-table tr[data-consumer="{consumer}"]')).to_be_visible()
    # The address its client connects from (the CLI, on this machine).
    expect(page.locator(f'#consumers-table tr[data-consumer="{consumer}"]')).to_contain_text("127.0.0.1:")
    wait_rate(page, "#topic-cards .rate-in .value", "topic in")
    expect(page.locator(".ledgers-table")).not_to_have_count(0)

    # Find by key: every message found has the key.
    page.fill("#find-key", key)
    page.click("#find-form button[type=submit]")
    keys = page.locator("#found-table tbody td.msg-key")
    expect(keys.first).to_have_text(key)
    found = keys.all_inner_texts()
    assert all(k == key for k in found), found
    print(f"OUT found {len(found)}", flush=True)
    page.wait_for_timeout(3000)  # a few seconds of chart
    shot(page, artifacts, "topic", full=True)


def test_reset(page, base, artifacts, topic, sub, when_ms):
    """Resets `sub` to `when_ms` (a whole second) through the page, then peeks."""
    # The page's time field is local time: the browser runs in UTC.
    when = datetime.fromtimestamp(int(when_ms) / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    page.goto(base + "/" + topic_hash(topic))
    row = page.locator(f'#subscriptions-table tr[data-subscription="{sub}"]')
    expect(row).to_be_visible()
    row.locator("input.reset-time").fill(when)
    row.locator("button.reset-cursor").click()
    dialog = page.locator("#confirm-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Reset the cursor")
    page.click("#confirm-ok")
    notice = page.locator("#notice")
    expect(notice).to_be_visible()
    print(f"OUT reset notice {notice.inner_text()}", flush=True)
    expect(notice).to_have_text(re.compile(r"^Done: reset"))
    # The next messages, as the consumer will get them.
    page.locator(f'#subscriptions-table tr[data-subscription="{sub}"] button.peek').click()
    payloads = page.locator("#peek-table tbody td.msg-payload")
    expect(payloads.first).not_to_be_empty()
    print(f"OUT peek first {payloads.first.inner_text()}", flush=True)
    page.click(".payload-toggle")
    print(f"OUT peek first hex {payloads.first.inner_text()}", flush=True)
    shot(page, artifacts, "topic-actions", full=True)


def test_skip_delete(page, base, artifacts, topic, sub):
    """Skips the backlog of `sub`, then deletes it, each after confirming."""
    page.goto(base + "/" + topic_hash(topic))
    row = page.locator(f'#subscriptions-table tr[data-subscription="{sub}"]')
    expect(row).to_be_visible()
    row.locator("button.skip-all").click()
    expect(page.locator("#confirm-dialog")).to_contain_text("Skip the backlog")
    page.click("#confirm-ok")
    expect(page.locator("#notice")).to_have_text(re.compile(r"^Done: skip the backlog"))
    expect(page.locator(f'#subscriptions-table tr[data-subscription="{sub}"] td.num').first).to_have_text("0")
    print("OUT skipped", flush=True)
    page.locator(f'#subscriptions-table tr[data-subscription="{sub}"] button.delete-sub').click()
    expect(page.locator("#confirm-dialog")).to_contain_text("Delete the subscription")
    page.click("#confirm-ok")
    expect(page.locator("#notice")).to_have_text(re.compile(r"^Done: delete"))
    expect(page.locator(f'#subscriptions-table tr[data-subscription="{sub}"]')).to_have_count(0)
    print("OUT deleted", flush=True)


def test_refused(page, base, artifacts, token, topic_local):
    """No token: the console asks for one. A limited token: creating a topic is refused."""
    dialog = page.locator("#token-dialog")
    expect(dialog).to_be_visible()
    print(f"OUT asked {dialog.locator('#token-why').inner_text()}", flush=True)
    page.fill("#token-input", token)
    page.click("#token-save")
    expect(dialog).to_be_hidden()
    stored = page.evaluate("sessionStorage.getItem('magnetar.token')")
    assert stored == token, "the token is not kept in sessionStorage"
    page.goto(base + "/#/topics")
    page.fill("#create-namespace", "public/default")
    page.fill("#create-name", topic_local)
    page.click("#create-topic button[type=submit]")
    notice = page.locator("#notice.error")
    expect(notice).to_be_visible()
    print(f"OUT refused {notice.inner_text()}", flush=True)
    shot(page, artifacts, "refused")


def main():
    name, base, artifacts, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    os.makedirs(artifacts, exist_ok=True)
    with sync_playwright() as p:
        browser, page, errors = open_page(p, base)
        try:
            if name == "workload":
                test_workload(page, base, artifacts, *args)
            elif name == "reset":
                test_reset(page, base, artifacts, *args)
            elif name == "skip_delete":
                test_skip_delete(page, base, artifacts, *args)
            elif name == "refused":
                test_refused(page, base, artifacts, *args)
            else:
                raise SystemExit(f"unknown test {name}")
        except Exception:
            try:
                shot(page, artifacts, f"failed-{name}")
                print("page text at failure:\n" + page.inner_text("body"), flush=True)
            except Exception as e:  # the page itself is gone
                print(f"no page at failure: {e}", flush=True)
            raise
        finally:
            browser.close()
        assert not errors, f"script errors on the page: {errors}"
    print(f"PASSED {name}", flush=True)


if __name__ == "__main__":
    main()
