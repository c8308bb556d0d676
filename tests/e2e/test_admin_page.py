"""The admin page (``/admin``) in a real headless Chromium against real gateways.

* A gateway without authentication, listening on loopback: the page shows everything to a
  local browser and changes its values after a Notify without a reload, and the local
  operator acts (as RabbitMQ's guest user on localhost); an action through a name that is
  not a loopback address (a DNS name a web page rebound to 127.0.0.1) is refused.
* A gateway with an admin token: the page shows nothing until someone signs in; an
  action is refused before; the signed-in admin pauses and purges, and the values follow.
  A screenshot of that page is saved under the test's tmp path (its path is printed:
  ``pytest -s`` shows it).

Costs two gateway starts and one browser start (about 3 s) and ~6 s of page interaction.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lxml.etree
import lxml.html
import pytest
import requests

from tests.e2e.conftest import Wsn
from tests.fixtures.server import ConsumerServer, RunningServer, serving
from tests.support.ports import closed_port
from tests.support.soap import WSNMOM
from tests.support.waiting import wait_until
from wsnmom.client import NotificationConsumer, WsnClient

pytestmark = pytest.mark.e2e

TOKEN = "page-test-admin-token-4711"
NS = "urn:example:plant"
API = "/wsn/admin/api"


def _gateway(env: dict[str, str]) -> Iterator[RunningServer]:
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-admin-page-"))
    server = RunningServer(
        "embedded",
        f"embedded://{data_dir / 'middleware'}",
        data_dir,
        extra_env={"WSNMOM_RETRY__MAX_ATTEMPTS": "1000", **env},
    )
    with serving(server):
        yield server


@pytest.fixture(scope="module")
def open_gateway() -> Iterator[RunningServer]:
    """No authentication (it listens on loopback only); charts sampled every 0.2 s.  Costly
    filters at the gateway's own priority and with a smaller CPU budget: the dead letters
    of a filter over its budget come within seconds on a loaded machine too (at the default
    nice 19, busy neighbours left the filter processes a share of a CPU so small that
    their 0.5 s took minutes)."""
    yield from _gateway(
        {
            "WSNMOM_ADMIN__CHART_INTERVAL": "0.2",
            "WSNMOM_FILTERS__COSTLY_NICE": "0",
            "WSNMOM_FILTERS__CPU_LIMIT": "0.2",
        }
    )


@pytest.fixture(scope="module")
def gateway() -> Iterator[RunningServer]:
    """Authentication on: the admin token."""
    yield from _gateway({"WSNMOM_AUTH__ADMIN_TOKEN": TOKEN})


@pytest.fixture
def down() -> Iterator[str]:
    """The base address of a consumer and publisher that are down (a port held closed)."""
    with closed_port() as port:
        yield f"http://127.0.0.1:{port}"


def _api(gateway: RunningServer, path: str) -> Any:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return requests.get(gateway.base_url + API + path, headers=headers, timeout=5).json()


def _text(web: Any, css: str) -> str:
    """The rendered text of the first element ``css`` selects ("" when none); read in one
    script call, as the page may replace cells between two WebDriver calls."""
    text = web.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css
    )
    return str(text).strip()


def _shown(web: Any, css: str) -> bool:
    return bool(
        web.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]))"
            ".some(e => e.offsetParent !== null);",
            css,
        )
    )


def _refreshes(web: Any) -> int:
    return int(web.execute_script("return document.getElementById('last-refresh').dataset.count"))


def _post_from_page(web: Any, path: str) -> Any:
    """POST ``path`` (relative to the page) with the page's own script, as a button would,
    and return the HTTP status."""
    return web.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0], {method: 'POST', headers: {'X-Requested-With': 'wsnmom-admin'}})"
        ".then(r => done(r.status), e => done(String(e)));",
        path,
    )


def test_the_local_operator_without_authentication(
    open_gateway: RunningServer, chromium: Any, down: str
) -> None:
    from selenium.webdriver.common.by import By

    web = chromium
    client = WsnClient(open_gateway.broker_url, namespaces={"p": NS})
    consumer = NotificationConsumer()
    live = client.subscribe(consumer, "p:line1/temperature")
    held = client.subscribe(consumer, "p:line1//*")
    held.pause()
    failing = client.subscribe(f"{down}/nobody-listens", "p:line1/temperature")
    pull_point = client.create_pull_point()
    registration = client.register_publisher(f"{down}/plc-7", ["p:line1//*"])

    web.get(open_gateway.base_url + "/admin?refresh=0.3")
    wait_until(what="a first refresh", check=lambda: _refreshes(web) >= 1)

    # -- what a reader sees
    assert web.title == "wsnmom admin"
    assert _text(web, "#health-adapter") == "embedded (queue)"
    assert _text(web, "#health-available") == "yes" and _text(web, "#health-ready") == "yes"
    assert _text(web, "#broker") == open_gateway.broker_url
    assert _text(web, "#role") == "local operator"
    assert _text(web, "#node-memory").endswith("MB") and int(_text(web, "#node-threads")) > 1
    assert _text(web, "#node-store").endswith("B") and _text(web, "#node-pid").startswith("process")
    # subscriptions show the namespaces of their prefixes
    assert f"p = {NS}" in _text(web, f'#subscriptions tr[data-id="{live.id}"]')
    assert not _shown(web, "#sign-in")  # nobody can sign in without authentication
    assert _text(web, "#total-subscriptions") == "3" and _text(web, "#total-pull-points") == "1"
    rows = web.find_elements(By.CSS_SELECTOR, "#subscriptions tbody tr")
    assert {r.get_attribute("data-id") for r in rows} == {live.id, held.id, failing.id}
    held_row = f'#subscriptions tr[data-id="{held.id}"]'
    assert _text(web, f"{held_row} .badge") == "paused"
    assert _shown(web, "td.actions")
    assert _text(web, f'#pull-points tr[data-id="{pull_point.id}"]')
    registration_row = f'#registrations tr[data-id="{registration.id}"]'
    assert f"{down}/plc-7" in _text(web, registration_row)
    assert "p:line1//*" in _text(web, registration_row)

    # -- values change after a Notify, without a reload
    marker = web.execute_script("return window.__marker = 'same page'")
    client.notify_many([(f"<celsius>{20 + i}</celsius>", "p:line1/temperature") for i in range(3)])
    consumer.wait_for(3)
    topic_row = f'#topics tr[data-topic="{{{NS}}}line1/temperature"]'
    wait_until(
        what="3 messages on the topic", check=lambda: _text(web, f"{topic_row} td.messages") == "3"
    )
    assert _text(web, "#total-messages") == "3"
    assert float(_text(web, f"{topic_row} td.rate").rstrip("/s")) > 0
    wait_until(what="a backlog of 3", check=lambda: _text(web, f"{held_row} td.backlog") == "3")
    live_row = f'#subscriptions tr[data-id="{live.id}"]'
    wait_until(what="3 delivered", check=lambda: _text(web, f"{live_row} td.delivered") == "3")
    down_row = f'#subscriptions tr[data-id="{failing.id}"]'
    wait_until(
        what="a failing consumer",
        check=lambda: _text(web, f"{down_row} td.failures") not in ("", "0"),
    )
    assert _text(web, f"{down_row} .badge") == "failing"
    assert down.removeprefix("http://") in _text(web, f"{down_row} td.error")
    assert web.execute_script("return window.__marker") == marker

    # -- the last hour's charts: drawn by the gateway, from its own counters
    history_url = f"{open_gateway.base_url}{API}/history"
    wait_until(
        what="the 3 notifications in the history",
        check=lambda: any(
            p["notifications"] > 0 for p in requests.get(history_url, timeout=5).json()["points"]
        ),
    )
    svg = requests.get(f"{open_gateway.base_url}{API}/charts/notifications.svg", timeout=5)
    assert svg.headers["Content-Type"] == "image/svg+xml"
    drawn = lxml.etree.fromstring(svg.content)
    assert drawn.find("{http://www.w3.org/2000/svg}polyline") is not None
    assert "Notifications in" in (drawn.findtext("{http://www.w3.org/2000/svg}title") or "")
    for name in ("notifications", "deliveries", "failures", "backlog"):
        assert (
            web.execute_script(
                "return document.getElementById(arguments[0]).naturalWidth", f"chart-{name}"
            )
            == 360
        )

    # -- the local operator acts from the page; not through a rebound DNS name
    rebound = requests.post(
        f"{open_gateway.base_url}{API}/subscriptions/{live.id}/pause",
        headers={"Host": f"rebound.example:{open_gateway.port}"},
        timeout=5,
    )
    assert rebound.status_code == 421  # the Host check refuses it before the admin API
    state = requests.get(f"{open_gateway.base_url}{API}/subscriptions/{live.id}", timeout=5)
    assert state.json()["state"] == "active"
    pause = web.find_element(By.CSS_SELECTOR, f"{live_row} td.actions button")
    assert pause.text == "Pause" and pause.is_displayed()
    pause.click()
    wait_until(what="the paused row", check=lambda: _text(web, f"{live_row} .badge") == "paused")
    state = requests.get(f"{open_gateway.base_url}{API}/subscriptions/{live.id}", timeout=5)
    assert state.json()["state"] == "paused"

    # -- one subscription's page, reached from its id in the table
    web.find_element(By.CSS_SELECTOR, f"{down_row} td a").click()
    wait_until(what="the subscription's page", check=lambda: _shown(web, "#detail"))
    assert web.current_url.endswith(f"admin?subscription={failing.id}")

    def field(name: str) -> str:
        return _text(web, f'#detail-fields tr[data-field="{name}"] td')

    wait_until(what="its fields", check=lambda: field("state") == "failing")
    assert field("consumer") == f"{down}/nobody-listens"
    assert field("topic").startswith("p:line1/temperature") and f"p = {NS}" in field("topic")
    assert field("policy") == "wrapped Notify, SOAP 1.2, push"
    # the delivery policy it follows (no wsnmom:DeliveryPolicy: the gateway's)
    followed = field("delivery policy")
    assert " attempts; exponential backoff from " in followed
    assert followed.endswith("(the gateway's)")
    assert int(field("failures")) >= 1 and down.removeprefix("http://") in field("last error")
    assert field("backlog").startswith("3 (")
    # its last delivery attempts, newest first: each failed, with the error
    first_attempt = "#detail-attempts tbody tr"
    wait_until(what="its attempts", check=lambda: "failed" in _text(web, first_attempt))
    assert down.removeprefix("http://") in _text(web, first_attempt)
    # the same page without JavaScript: the server fills in the fields and the attempts
    served = requests.get(f"{open_gateway.base_url}/admin?subscription={failing.id}", timeout=5)
    page = lxml.html.fromstring(served.content)
    assert page.get_element_by_id("detail").get("hidden") is None
    consumer_cell = page.xpath('//*[@id="detail-fields"]/tr[@data-field="consumer"]/td')[0]
    assert consumer_cell.text_content() == f"{down}/nobody-listens"
    policy_cell = page.xpath('//*[@id="detail-fields"]/tr[@data-field="delivery policy"]/td')
    assert policy_cell[0].text_content() == followed  # the same line as the script's
    rows = page.xpath('//*[@id="detail-attempts"]/tbody/tr')
    assert rows and all("failed" in r.text_content() for r in rows)
    # the API: the live subscription's attempts delivered the 3 messages
    live_state = requests.get(f"{open_gateway.base_url}{API}/subscriptions/{live.id}", timeout=5)
    attempts = live_state.json()["attempts"]
    assert all(a["ok"] and a["error"] is None for a in attempts)
    assert sum(a["messages"] for a in attempts) == 3
    missing = requests.get(f"{open_gateway.base_url}/admin?subscription=nope", timeout=5)
    assert "no subscription 'nope'" in missing.text
    consumer.close()
    client.close()


def test_peek_shows_waiting_messages_without_consuming_them(
    open_gateway: RunningServer, chromium: Any
) -> None:
    """Peek on the per-subscription page (``?subscription=ID``) and a pull point's
    (``?pull_point=ID``): the first waiting messages with topic, headers and payload, filled
    in on the server (no JavaScript needed) and by the script, and all still waiting."""
    from selenium.webdriver.common.by import By

    web = chromium
    client = WsnClient(open_gateway.broker_url, namespaces={"p": NS})
    sub = client.subscribe("http://127.0.0.1:9/peeked", "p:peek")
    sub.pause()
    client.notify_many([(f"<v>{i}</v>", "p:peek") for i in range(3)])
    wait_until(
        what="a backlog of 3",
        check=lambda: _api(open_gateway, f"/subscriptions/{sub.id}")["backlog"] == 3,
    )
    served = requests.get(f"{open_gateway.base_url}/admin?subscription={sub.id}", timeout=5)
    doc = lxml.html.fromstring(served.content)
    assert doc.get_element_by_id("peek").get("hidden") is None
    body = doc.get_element_by_id("peek-messages").find("tbody")
    cells = [row.findall("td")[6].text for row in body]
    assert cells == ["<v>0</v>", "<v>1</v>", "<v>2</v>"]
    web.get(f"{open_gateway.base_url}/admin?subscription={sub.id}&refresh=0")
    wait_until(what="a first refresh", check=lambda: _refreshes(web) >= 1)
    rows = web.find_elements(By.CSS_SELECTOR, "#peek-messages tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[6].text for r in rows] == cells
    assert {r.get_attribute("data-where") for r in rows} == {"middleware"}
    assert f"{{{NS}}}peek" in rows[0].text and _text(web, "#peek-count") == "(3)"
    assert _api(open_gateway, f"/subscriptions/{sub.id}")["backlog"] == 3

    pp = client.create_pull_point()
    feeder = client.subscribe(pp.address, "p:peek")
    client.notify("<v>pp</v>", "p:peek")
    web.get(f"{open_gateway.base_url}/admin?pull_point={pp.id}&refresh=0.3")
    wait_until(
        what="the pull point's message",
        check=lambda: "<v>pp</v>" in _text(web, "#peek-messages tbody"),
    )
    assert _text(web, "#peek-title") == f"Waiting messages of pull point {pp.id}"
    assert [n.payload_xml for n in pp.get_messages(10)] == [b"<v>pp</v>"]
    web.refresh()  # the page peeks again every 10 s; a reload at once
    wait_until(
        what="nothing waiting",
        check=lambda: _text(web, "#peek-messages tbody") == "nothing waiting",
    )
    feeder.unsubscribe()
    pp.destroy()
    sub.unsubscribe()
    client.close()


def test_subscriptions_are_searched_and_paged_by_the_gateway(
    open_gateway: RunningServer, chromium: Any
) -> None:
    """Beyond what one page shows: the search box, the sort and the pages come from the
    gateway (``GET subscriptions?q=&sort=&offset=&limit=``)."""
    import uuid

    from selenium.webdriver.common.by import By

    web = chromium
    tag = uuid.uuid4().hex[:8]
    client = WsnClient(open_gateway.broker_url, namespaces={"p": NS})
    subs = [client.subscribe(f"http://127.0.0.1:9/{tag}/{n:03d}", "p:q") for n in range(105)]
    web.get(open_gateway.base_url + "/admin?refresh=0")
    wait_until(what="a first refresh", check=lambda: _refreshes(web) >= 1)
    web.find_element(By.ID, "sub-search").send_keys(tag)
    wait_until(
        what="the first page",
        timeout=30,
        check=lambda: _text(web, "#sub-page") == "1 to 100 of 105",
    )
    wait_until(  # the label and the rows are two updates of the page
        what="100 rows",
        check=lambda: len(web.find_elements(By.CSS_SELECTOR, "#subscriptions tbody tr")) == 100,
    )
    # Next clicked while the sort's refresh is under way (as it writes the page label, after
    # it read the query): the click is not lost (it was: a refresh asked for while one ran
    # was dropped, and a loaded machine widens that moment)
    web.execute_script(
        "const label = document.getElementById('sub-page');"
        "const seen = new MutationObserver(() => {"
        "  seen.disconnect(); document.getElementById('sub-next').click(); });"
        "seen.observe(label, { childList: true });"
        "const sort = document.getElementById('sub-sort');"
        "sort.value = 'consumer'; sort.dispatchEvent(new Event('change'));"
    )
    wait_until(  # two refreshes in a row, each of several requests to the gateway
        what="the second page",
        timeout=30,
        check=lambda: _text(web, "#sub-page") == "101 to 105 of 105",
    )
    expected = [s.id for s in subs[100:]]
    wait_until(
        what="the second page's rows",
        check=lambda: (
            web.execute_script(
                "return Array.from(document.querySelectorAll('#subscriptions tbody tr'))"
                ".map((r) => r.dataset.id)"
            )
            == expected
        ),
    )
    search = web.find_element(By.ID, "sub-search")
    search.send_keys("/104")
    wait_until(what="one match", timeout=30, check=lambda: _text(web, "#sub-page") == "1 to 1 of 1")
    for sub in subs:
        sub.unsubscribe()
    client.close()


def test_dead_letters_are_listed_replayed_and_purged_from_the_page(
    open_gateway: RunningServer, chromium: Any
) -> None:
    """The dead-letter table (``GET dead-letters``) with its Replay, Replay to… and Purge
    buttons; a filter over its budget makes the dead letters (this gateway retries for
    ever)."""
    from selenium.webdriver.common.by import By

    web = chromium
    client = WsnClient(open_gateway.broker_url, namespaces={"p": NS})
    consumer = NotificationConsumer()
    costly = "count(//a[count(//a[count(//a) > 0]) > 0]) > 0"  # minutes of CPU on BIG
    big = "<r>" + "<a/>" * 3000 + "</r>"
    for _ in range(2):
        client.subscribe("http://127.0.0.1:9/never", "p:dl", message_content=costly)
    client.notify(big, "p:dl")
    letters = wait_until(  # two filter evaluations running out of their 0.2 CPU seconds
        what="two dead letters",
        timeout=60,
        check=lambda: (
            len(ids := [d["id"] for d in _api(open_gateway, "/dead-letters")["dead_letters"]]) == 2
            and ids
        ),
    )
    # their messages (the page's link "their messages": ?peek=dead-letters)
    web.get(open_gateway.base_url + "/admin?peek=dead-letters&refresh=0")
    wait_until(what="a first refresh", check=lambda: _refreshes(web) >= 1)
    peeked = web.find_elements(By.CSS_SELECTOR, "#peek-messages tbody tr")
    assert [r.get_attribute("data-where") for r in peeked] == ["dead letter (filter-budget)"] * 2
    assert all(r.find_elements(By.TAG_NAME, "td")[6].text.startswith("<r>") for r in peeked)
    web.get(open_gateway.base_url + "/admin?refresh=0.3")
    rows = [f'#dead-letters tr[data-id="{i}"]' for i in letters]
    wait_until(what="the rows", check=lambda: all(_text(web, r) for r in rows))
    assert "filter-budget" in _text(web, rows[0])
    # Replay to… an address (the page asks for it), then Purge the other (it confirms)
    web.execute_script(f"window.prompt = () => {consumer.address!r}; window.confirm = () => true;")
    buttons = web.find_elements(By.CSS_SELECTOR, f"{rows[0]} td.actions button")
    assert [b.text for b in buttons] == ["Replay", "Replay to…", "Purge"]
    buttons[1].click()
    consumer.wait_for(1)
    wait_until(what="the replayed row gone", check=lambda: not _text(web, rows[0]))
    web.find_elements(By.CSS_SELECTOR, f"{rows[1]} td.actions button")[2].click()
    wait_until(what="the purged row gone", check=lambda: not _text(web, rows[1]))
    assert _api(open_gateway, "/dead-letters")["count"] == 0
    consumer.close()
    client.close()


def test_a_subscriptions_page_lists_its_dead_letters(
    open_gateway: RunningServer, chromium: Any, consumer: ConsumerServer
) -> None:
    """A consumer's final status (``wsnmom:DeliveryPolicy/FinalStatuses``) sends a message
    straight to the dead letters and the subscription goes on: its page lists that dead
    letter, served filled in and after the script's refresh, and no other."""
    from selenium.webdriver.common.by import By

    web = chromium
    consumer.mode, consumer.error_status = "error", 410
    wsn = Wsn(open_gateway, f"urn:test:{uuid.uuid4().hex[:12]}")
    policy = (
        f'<wsnmom:DeliveryPolicy xmlns:wsnmom="{WSNMOM}">'
        "<wsnmom:FinalStatuses>410</wsnmom:FinalStatuses></wsnmom:DeliveryPolicy>"
    )
    sub = wsn.subscribe(consumer.address("/gone"), "tns:final", policy=policy)
    other = wsn.subscribe(consumer.address("/other"), "tns:final", policy=policy)
    wsn.notify(("tns:final", "<n>gone</n>"))

    def own() -> list[dict[str, Any]]:
        return [
            d
            for d in _api(open_gateway, "/dead-letters")["dead_letters"]
            if d["subscription"] == sub.id
        ]

    [letter] = wait_until(own, 30, what="the subscription's dead letter")
    assert letter["reason"] == "final-status"
    assert [d["id"] for d in _api(open_gateway, f"/subscriptions/{sub.id}")["dead_letters"]] == [
        letter["id"]
    ]
    web.get(open_gateway.base_url + f"/admin?subscription={sub.id}&refresh=0")
    row = f'#detail-dead-letters tr[data-id="{letter["id"]}"]'
    assert "final-status" in _text(web, row)
    wait_until(what="a first refresh", check=lambda: _refreshes(web) >= 1)
    assert "final-status" in _text(web, row)
    assert len(web.find_elements(By.CSS_SELECTOR, "#detail-dead-letters tr[data-id]")) == 1
    for s in (sub, other):
        wsn.post(s.address, "<wsnt:Unsubscribe/>").ok()


def test_an_admin_signs_in_and_acts(
    gateway: RunningServer, chromium: Any, tmp_path: Path, down: str
) -> None:
    from selenium.webdriver.common.by import By

    web = chromium
    client = WsnClient(gateway.broker_url, namespaces={"p": NS}, token=TOKEN)
    consumer = NotificationConsumer()
    live = client.subscribe(consumer, "p:line1/temperature")
    held = client.subscribe(consumer, "p:line1//*")
    held.pause()
    client.subscribe(f"{down}/nobody-listens", "p:line1/temperature")
    client.create_pull_point()
    client.register_publisher(f"{down}/plc-7", ["p:line1//*"])

    web.get(gateway.base_url + "/admin?refresh=0.3")
    wait_until(what="the sign-in form", check=lambda: _shown(web, "#sign-in"))
    assert _shown(web, "#no-access") and not _shown(web, "#content")
    # -- refused before signing in (401 without a challenge: no browser dialog)
    assert _post_from_page(web, f"wsn/admin/api/subscriptions/{live.id}/pause") == 401
    assert _api(gateway, f"/subscriptions/{live.id}")["state"] == "active"
    # the charts too, but without a challenge (the page loads them as images: a challenge
    # would open the browser's own password dialog, which once hung this page's load)
    chart = requests.get(f"{gateway.base_url}{API}/charts/backlog.svg", timeout=5)
    assert chart.status_code == 401 and "WWW-Authenticate" not in chart.headers

    web.find_element(By.ID, "token").send_keys(TOKEN)
    web.find_element(By.CSS_SELECTOR, "#sign-in button").click()
    wait_until(what="the admin role", check=lambda: _text(web, "#role") == "admin")
    wait_until(
        what="the charts, loaded again after the sign-in",
        check=lambda: (
            web.execute_script("return document.getElementById('chart-backlog').naturalWidth")
            == 360
        ),
    )
    assert _shown(web, "#sign-out") and not _shown(web, "#sign-in")
    before = _refreshes(web)
    wait_until(what="a refresh after signing in", check=lambda: _refreshes(web) > before)
    client.notify_many([(f"<celsius>{20 + i}</celsius>", "p:line1/temperature") for i in range(3)])
    held_row = f'#subscriptions tr[data-id="{held.id}"]'
    wait_until(what="a backlog of 3", check=lambda: _text(web, f"{held_row} td.backlog") == "3")

    live_row = f'#subscriptions tr[data-id="{live.id}"]'
    pause = web.find_element(By.CSS_SELECTOR, f"{live_row} td.actions button")
    assert pause.text == "Pause" and pause.is_displayed()
    pause.click()
    wait_until(what="the paused row", check=lambda: _text(web, f"{live_row} .badge") == "paused")
    assert _api(gateway, f"/subscriptions/{live.id}")["state"] == "paused"
    assert "pause" in _text(web, "#notice")

    purge = next(
        b
        for b in web.find_elements(By.CSS_SELECTOR, f"{held_row} td.actions button")
        if b.text == "Purge"
    )
    purge.click()
    web.switch_to.alert.accept()
    wait_until(what="an empty backlog", check=lambda: _text(web, f"{held_row} td.backlog") == "0")
    assert _api(gateway, f"/subscriptions/{held.id}")["backlog"] == 0
    assert "3 message(s) dropped" in _text(web, "#notice")

    # -- the Publish form: a Notify from the page, seen by a subscriber and the topics
    watcher = NotificationConsumer()
    client.subscribe(watcher, "p:line1/temperature")
    assert _shown(web, "#publish")
    web.find_element(By.ID, "publish-topic").send_keys(f"{{{NS}}}line1/temperature")
    web.find_element(By.ID, "publish-payload").send_keys("<celsius>99</celsius>")
    web.find_element(By.ID, "publish-headers").send_keys("tenant=plant-7")
    web.find_element(By.CSS_SELECTOR, "#publish button").click()
    wait_until(what="the published notice", check=lambda: "published on" in _text(web, "#notice"))
    topic_row = f'#topics tr[data-topic="{{{NS}}}line1/temperature"]'
    wait_until(
        what="4 messages on the topic", check=lambda: _text(web, f"{topic_row} td.messages") == "4"
    )
    current = client.get_current_message("p:line1/temperature")
    assert current.payload.tag == "celsius" and current.payload.text == "99"
    # the subscriber got it with the header the form gave
    (pushed,) = watcher.wait_for(1)
    assert pushed.payload.text == "99" and pushed.app_headers == {"tenant": "plant-7"}
    watcher.close()

    shot = tmp_path / "admin-page.png"
    web.set_window_size(1440, int(web.execute_script("return document.body.scrollHeight")) + 200)
    assert web.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    print(f"\nadmin page screenshot: {shot}")

    # -- signing out takes everything away again
    web.find_element(By.ID, "sign-out").click()
    wait_until(what="the sign-in form again", check=lambda: _shown(web, "#sign-in"))
    assert not _shown(web, "#publish")
    assert _text(web, "#role") == "read-only" and not _shown(web, "#content")
    consumer.close()
    client.close()


@pytest.mark.parametrize(("ci", "outcome"), [("", {"skipped": 1}), ("true", {"errors": 1})])
def test_a_missing_chromium_skips_or_fails_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str, outcome: dict[str, int]
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("WSNMOM_TEST_CHROMIUM", str(pytester.path / "no-such-chromium"))
    pytester.makeconftest('pytest_plugins = ["tests.fixtures.browser"]')
    pytester.makepyfile("def test_page(chromium):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(**outcome)
    result.stdout.fnmatch_lines(["*no headless Chromium for the page tests*chromium-driver*"])
