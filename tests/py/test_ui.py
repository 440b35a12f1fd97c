"""The web UI in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`) driven by Selenium against a three-server cairn cluster
serving the UI (`--ui`), and a default-deny ACL server. Every page is
screenshotted, into a temporary directory, or into the one `CAIRN_UI_SHOTS`
names (`CAIRN_UI_SHOTS=docs/ui` refreshes the README's pictures).

Under CI (`CI` set) a missing browser fails the run rather than skipping."""

import json
import os
import pathlib
import shutil
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from conftest import CairnServer, ThreeServers, chromium

SHOTS = pathlib.Path(os.environ.get("CAIRN_UI_SHOTS") or tempfile.mkdtemp(prefix="cairn-ui-shots-"))
ACL_ROOT = "6f1c2a4e-0000-4000-8000-0000000000ui"

try:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
except ImportError:  # pragma: no cover - reported by the chromium fixture
    pass


def wait_until(what, f, timeout=10):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            v = f()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


def call(base, method, path, body=None, token=None, raw=False):
    data = None
    if body is not None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    if token:
        req.add_header("X-Consul-Token", token)
    with urllib.request.urlopen(req, timeout=15) as r:
        text = r.read()
    if raw:
        return text
    return json.loads(text) if text else None



FEDERATION_KEY = "q0rYb3IpZzBYF8kGMfJ0ZV1tqRk3eE2vK7m8Xo1nQ5c="


@pytest.fixture(scope="module")
def cluster():
    root = pathlib.Path(tempfile.mkdtemp(prefix="cairn-ui-"))
    # The key: dc2 federates with this cluster, and WAN federation is
    # served only on an authenticated Raft transport.
    c = ThreeServers(root, extra=("--ui", "--encrypt", FEDERATION_KEY), name="cairn-ui")
    yield c
    c.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def chrome():
    d = chromium()
    yield d
    d.quit()


@pytest.fixture
def browser(chrome):
    """The module's browser, its console log read empty first: each test
    judges only the messages its own pages logged (an earlier test's
    expected refusals, such as the ACL page's 403s, stay with it)."""
    console_errors(chrome)
    chrome.set_window_size(1280, 800)
    return chrome


def console_errors(d):
    return [e for e in d.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def open_page(d, base, hash_):
    d.get(f"{base}/ui/#{hash_}")


def shot(d, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    d.save_screenshot(str(SHOTS / f"{name}.png"))


def text_of(d, css):
    return d.find_element(By.CSS_SELECTOR, css).text


def register(base, node, name, sid, status="passing", token=None, extra=None):
    body = {"Node": node, "Address": "10.1.0.1",
            "Service": {"ID": sid, "Service": name, "Port": 8080, "Tags": ["v1"], "Meta": {"team": "ops"}},
            "Check": {"CheckID": f"{sid}-check", "Name": f"{name} alive", "ServiceID": sid,
                      "Status": status, "Output": f"{name} is {status}"}}
    if extra:
        body["Service"].update(extra)
    return call(base, "PUT", "/v1/catalog/register", body, token)


def set_check(base, node, sid, name, status):
    return call(base, "PUT", "/v1/catalog/register", {
        "Node": node, "Address": "10.1.0.1", "SkipNodeUpdate": True,
        "Check": {"CheckID": f"{sid}-check", "Name": f"{name} alive", "ServiceID": sid,
                  "Status": status, "Output": f"{name} is {status}"}})


def test_the_root_redirects_and_every_page_loads_without_console_errors(cluster, browser):
    base = cluster.url
    d = browser
    register(base, "ui-n1", "web", "web1")
    register(base, "ui-n2", "api", "api1")
    call(base, "PUT", "/v1/catalog/register", {
        "Node": "ui-n1", "Address": "10.1.0.1", "SkipNodeUpdate": True,
        "Service": {"ID": "web1-sidecar-proxy", "Service": "web-sidecar-proxy", "Kind": "connect-proxy",
                    "Port": 21000, "Proxy": {"DestinationServiceName": "web", "DestinationServiceID": "web1",
                                             "Upstreams": [{"DestinationName": "api", "LocalBindPort": 9000}]}}})
    call(base, "PUT", "/v1/kv/app/config/db", "postgres://db")
    call(base, "PUT", "/v1/config", {"Kind": "service-defaults", "Name": "web", "Protocol": "http"})
    call(base, "PUT", "/v1/connect/intentions/exact?source=web&destination=api", {"Action": "allow"})
    sid = call(base, "PUT", "/v1/session/create", {"Node": "ui-n1", "Name": "ui-lock"})["ID"]
    d.get(base + "/")
    wait_until("the redirect to /ui/", lambda: "/ui/" in d.current_url)
    pages = [
        ("services", "/services", "#services table"),
        ("service", "/services/web", "#service-body table"),
        ("service-topology", "/services/web/topology", ".topo li[data-edge='api']"),
        ("service-routing", "/services/web/routing", "#chain"),
        ("service-intentions", "/services/api/intentions", "tr[data-source='web']"),
        ("nodes", "/nodes", "#nodes table"),
        ("node", "/nodes/ui-n1", "#node-sessions table"),
        ("kv", "/kv/app/config/", "li[data-key='app/config/db']"),
        ("kv-key", "/kv/app/config/db", "#kv-edit"),
        ("intentions", "/intentions", "#intentions table"),
        ("config", "/config/service-defaults", "tr[data-entry='web']"),
        ("config-entry", "/config/service-defaults/web", "#config-body"),
        ("acl", "/acl", "#acl-login"),
    ]
    console_errors(d)  # drop what came before
    for name, path, ready in pages:
        open_page(d, base, path)
        wait_until(f"{path} to show {ready}", lambda r=ready: d.find_elements(By.CSS_SELECTOR, r), 10)
        assert not d.find_elements(By.CSS_SELECTOR, "p.error"), f"{path}: {text_of(d, 'p.error')}"
        if name == "node":
            assert "ui-lock" in text_of(d, "#node-sessions")
        if name == "kv-key":
            wait_until("the value", lambda: d.find_element(By.ID, "kv-value").get_attribute("value") == "postgres://db")
        shot(d, name)
        errs = console_errors(d)
        assert not errs, f"{path}: console errors {errs}"
    # Phone width: the services list stays readable (no horizontal page scroll).
    d.set_window_size(390, 800)
    open_page(d, base, "/services")
    wait_until("the services", lambda: d.find_elements(By.CSS_SELECTOR, "#services table"))
    shot(d, "services-phone")
    width = d.execute_script("return document.documentElement.scrollWidth")
    assert width <= 400, f"page is {width}px wide on a phone"
    d.set_window_size(1280, 800)
    call(base, "PUT", f"/v1/session/destroy/{sid}")


def test_a_registered_service_appears_live_and_turns_red(cluster, browser):
    base = cluster.url
    d = browser
    open_page(d, base, "/services")
    wait_until("the list", lambda: d.find_elements(By.CSS_SELECTOR, "#services table"))
    time.sleep(0.3)  # the page's blocking query is parked
    # Registered through another server than the one serving the page.
    other = f"http://127.0.0.1:{cluster.http[1]}"
    t0 = time.time()
    register(other, "ui-n3", "billing", "billing1")
    row = "tr[data-service='billing']"
    wait_until("billing on the open page", lambda: d.find_elements(By.CSS_SELECTOR, row), 2)
    assert time.time() - t0 < 2
    assert d.find_element(By.CSS_SELECTOR, row).get_attribute("data-health") == "passing"
    set_check(other, "ui-n3", "billing1", "billing", "critical")
    wait_until("billing red", lambda: d.find_element(By.CSS_SELECTOR, row).get_attribute("data-health") == "critical", 2)
    color = d.find_element(By.CSS_SELECTOR, f"{row} .badge").value_of_css_property("color")
    assert color.replace(" ", "") in ("rgba(198,40,40,1)", "rgb(198,40,40)"), color
    # Filters and search narrow the list.
    Select(d.find_element(By.ID, "svc-health")).select_by_value("critical")
    names = [r.get_attribute("data-service") for r in d.find_elements(By.CSS_SELECTOR, "#services tbody tr")]
    assert names == ["billing"], names
    shot(d, "services-critical")
    Select(d.find_element(By.ID, "svc-health")).select_by_value("all")
    d.find_element(By.ID, "svc-search").send_keys("web")
    names = [r.get_attribute("data-service") for r in d.find_elements(By.CSS_SELECTOR, "#services tbody tr")]
    assert names == ["web"], names
    # The service page shows the check and its output.
    open_page(d, base, "/services/billing")
    wait_until("the instance", lambda: "billing is critical" in text_of(d, "#service-body"))


def test_kv_create_edit_delete_and_a_concurrent_edit(cluster, browser):
    base = cluster.url
    d = browser
    open_page(d, base, "/kv/ui-test/")
    wait_until("the folder", lambda: d.find_elements(By.ID, "kv-create"))
    d.find_element(By.ID, "kv-new-key").send_keys("greeting")
    d.find_element(By.ID, "kv-new-value").send_keys("hello")
    d.find_element(By.CSS_SELECTOR, "#kv-create button[type=submit]").click()
    wait_until("created", lambda: call(base, "GET", "/v1/kv/ui-test/greeting?raw", raw=True) == b"hello")
    wait_until("the key listed", lambda: d.find_elements(By.CSS_SELECTOR, "li[data-key='ui-test/greeting']"))
    # Edit.
    open_page(d, base, "/kv/ui-test/greeting")
    wait_until("the value", lambda: d.find_element(By.ID, "kv-value").get_attribute("value") == "hello")
    box = d.find_element(By.ID, "kv-value")
    box.clear()
    box.send_keys("hello, world")
    d.find_element(By.ID, "kv-save").click()
    wait_until("saved", lambda: call(base, "GET", "/v1/kv/ui-test/greeting?raw", raw=True) == b"hello, world")
    wait_until("the saved message", lambda: "Saved" in text_of(d, "#kv-message"))
    # Someone else changes it; the UI's save is refused and says so.
    call(base, "PUT", "/v1/kv/ui-test/greeting", "theirs")
    box = d.find_element(By.ID, "kv-value")
    box.clear()
    box.send_keys("mine")
    d.find_element(By.ID, "kv-save").click()
    wait_until("the conflict reported", lambda: d.find_elements(By.ID, "kv-conflict"))
    assert "changed by someone else" in text_of(d, "#kv-conflict")
    assert call(base, "GET", "/v1/kv/ui-test/greeting?raw", raw=True) == b"theirs"
    shot(d, "kv-conflict")
    # Load the current value, then delete the key.
    d.find_element(By.CSS_SELECTOR, "#kv-conflict button").click()
    wait_until("reloaded", lambda: d.find_element(By.ID, "kv-value").get_attribute("value") == "theirs")
    d.find_element(By.ID, "kv-delete").click()
    wait_until("deleted", lambda: kv_missing(base, "ui-test/greeting"))
    # A folder's delete asks first; cancel keeps it, confirm deletes it.
    call(base, "PUT", "/v1/kv/ui-test/dir/a", "1")
    call(base, "PUT", "/v1/kv/ui-test/dir/b", "2")
    open_page(d, base, "/kv/ui-test/")
    wait_until("the folder", lambda: d.find_elements(By.CSS_SELECTOR, "li[data-key='ui-test/dir/'] button"))
    d.find_element(By.CSS_SELECTOR, "li[data-key='ui-test/dir/'] button").click()
    wait_until("the question", lambda: d.find_element(By.ID, "kv-confirm").is_displayed())
    shot(d, "kv-folder-delete")
    d.find_element(By.ID, "kv-confirm-cancel").click()
    assert not kv_missing(base, "ui-test/dir/a")
    d.find_element(By.CSS_SELECTOR, "li[data-key='ui-test/dir/'] button").click()
    wait_until("the question", lambda: d.find_element(By.ID, "kv-confirm").is_displayed())
    d.find_element(By.ID, "kv-confirm-delete").click()
    wait_until("the folder deleted", lambda: kv_missing(base, "ui-test/dir/a") and kv_missing(base, "ui-test/dir/b"))


def kv_missing(base, key):
    try:
        call(base, "GET", f"/v1/kv/{key}")
        return False
    except urllib.error.HTTPError as e:
        return e.code == 404


def test_an_intention_created_in_the_ui_denies(cluster, browser):
    base = cluster.url
    d = browser
    check = "/v1/connect/intentions/check?source=frontend&destination=payments"
    open_page(d, base, "/intentions")
    wait_until("the form", lambda: d.find_elements(By.ID, "int-form"))
    d.find_element(By.ID, "int-source").send_keys("frontend")
    d.find_element(By.ID, "int-destination").send_keys("payments")
    Select(d.find_element(By.ID, "int-action")).select_by_value("deny")
    d.find_element(By.ID, "int-description").send_keys("no card data from the frontend")
    d.find_element(By.CSS_SELECTOR, "#int-form button[type=submit]").click()
    wait_until("the check denies", lambda: call(base, "GET", check)["Allowed"] is False)
    row = "tr[data-source='frontend'][data-destination='payments']"
    wait_until("the row", lambda: d.find_elements(By.CSS_SELECTOR, row))
    assert "deny" in text_of(d, row)
    shot(d, "intentions-created")
    # Deleted from the UI: the check is back to the default (allow, ACLs off).
    d.find_element(By.CSS_SELECTOR, f"{row} button.danger").click()
    wait_until("the check allows", lambda: call(base, "GET", check)["Allowed"] is True)


def test_the_routing_page_draws_router_splitter_resolver_and_weights(cluster, browser):
    base = cluster.url
    d = browser
    register(base, "ui-n4", "shop", "shop1")
    for e in [
        {"Kind": "service-defaults", "Name": "shop", "Protocol": "http"},
        {"Kind": "service-resolver", "Name": "shop",
         "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"}}},
        {"Kind": "service-splitter", "Name": "shop",
         "Splits": [{"Weight": 90, "ServiceSubset": "v1"}, {"Weight": 10, "ServiceSubset": "v2"}]},
        {"Kind": "service-router", "Name": "shop",
         "Routes": [{"Match": {"HTTP": {"PathPrefix": "/admin"}}, "Destination": {"Service": "shop", "ServiceSubset": "v2"}}]},
    ]:
        assert call(base, "PUT", "/v1/config", e) is True
    open_page(d, base, "/services/shop/routing")
    wait_until("the chain", lambda: d.find_elements(By.CSS_SELECTOR, "#chain .card.router"))
    graph = text_of(d, "#chain")
    for part in ("Router shop", "Splitter shop", "Resolver v1.shop", "Resolver v2.shop", "path prefix /admin", "90%", "10%"):
        assert part in graph, f"{part!r} not in {graph!r}"
    weights = sorted(e.get_attribute("data-weight") for e in d.find_elements(By.CSS_SELECTOR, "#chain .splitter li"))
    assert weights == ["10", "90"], weights
    assert d.find_elements(By.CSS_SELECTOR, "#chain .card.target")
    shot(d, "routing")


@pytest.fixture(scope="module")
def acl_server():
    s = CairnServer(extra=("--acl-enabled", "--acl-default-policy", "deny",
                           "--acl-initial-management-token", ACL_ROOT))
    wait_until("the management token", lambda: call(s.url, "GET", "/v1/acl/token/self", token=ACL_ROOT), 15)
    yield s
    s.stop()


def test_with_default_deny_the_ui_asks_for_a_token_then_shows_what_it_may_read(acl_server, browser):
    base = acl_server.url
    d = browser
    for node, name in (("acl-n1", "web"), ("acl-n2", "secret")):
        register(base, node, name, f"{name}1", token=ACL_ROOT)
    call(base, "PUT", "/v1/acl/policy", {"Name": "web-read",
         "Rules": 'service "web" { policy = "read" }\nnode_prefix "" { policy = "read" }'}, ACL_ROOT)
    tok = call(base, "PUT", "/v1/acl/token", {"Description": "web reader", "Policies": [{"Name": "web-read"}]}, ACL_ROOT)
    d.get(base + "/ui/")
    d.execute_script("localStorage.clear()")
    open_page(d, base, "/services")
    wait_until("the ask for a token", lambda: d.find_elements(By.ID, "acl-filtered"))
    assert not d.find_elements(By.CSS_SELECTOR, "#services tbody tr")
    shot(d, "acl-anonymous")
    # The prompt's link leads to the login form, keyboard only.
    d.find_element(By.CSS_SELECTOR, "#acl-filtered a").click()
    wait_until("the login form", lambda: d.find_elements(By.ID, "acl-token"))
    box = d.find_element(By.ID, "acl-token")
    box.send_keys(tok["SecretID"])
    box.submit()
    wait_until("logged in", lambda: "Logged in" in text_of(d, "#acl-message"))
    assert d.execute_script("return localStorage.getItem('cairn.token')") == tok["SecretID"]
    # No acl:read: the lists say which permission is missing.
    wait_until("the lists", lambda: "acl:read" in text_of(d, "#acl-lists"))
    shot(d, "acl-logged-in")
    open_page(d, base, "/services")
    wait_until("web listed", lambda: d.find_elements(By.CSS_SELECTOR, "tr[data-service='web']"))
    names = [r.get_attribute("data-service") for r in d.find_elements(By.CSS_SELECTOR, "#services tbody tr")]
    assert names == ["web"], names
    # A page it may not read says which permission it lacks.
    open_page(d, base, "/services/secret/topology")
    wait_until("the 403 in words", lambda: d.find_elements(By.CSS_SELECTOR, "p.error"))
    msg = text_of(d, "p.error")
    assert "service:read" in msg and "secret" in msg, msg
    shot(d, "acl-denied")
    d.execute_script("localStorage.clear()")


def test_keyboard_alone_reaches_the_sections_and_the_search(cluster, browser):
    from selenium.webdriver.common.keys import Keys
    d = browser
    base = cluster.url
    open_page(d, base, "/services")
    d.refresh()  # a fresh load: focus starts at the top of the document
    wait_until("the list", lambda: d.find_elements(By.CSS_SELECTOR, "#services table"))
    seen = []
    for _ in range(12):
        d.switch_to.active_element.send_keys(Keys.TAB)
        el = d.switch_to.active_element
        seen.append(el.text or el.get_attribute("id"))
        if el.text == "Nodes":
            el.send_keys(Keys.ENTER)
            break
    else:
        raise AssertionError(f"Tab never reached the Nodes link: {seen}")
    wait_until("the nodes page", lambda: d.current_url.endswith("#/nodes") and d.find_elements(By.CSS_SELECTOR, "#nodes table"))
    assert seen[0] == "Skip to content", seen
    # Every form control has a label a screen reader reads.
    for path in ("/services", "/kv/", "/intentions", "/acl"):
        open_page(d, base, path)
        wait_until(f"{path} loaded", lambda: not d.find_elements(By.XPATH, "//main/p[text()='Loading…']"))
        time.sleep(0.2)
        unlabeled = d.execute_script("""
            return [...document.querySelectorAll('main input, main select, main textarea')]
              .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label'))
              .map(e => e.id || e.outerHTML);""")
        assert not unlabeled, f"{path}: {unlabeled}"


def services_shown(d):
    return [r.get_attribute("data-service") for r in d.find_elements(By.CSS_SELECTOR, "#services tbody tr")]


def test_the_tag_filter_keeps_only_services_with_that_tag(cluster, browser):
    base = cluster.url
    d = browser
    register(base, "ui-n5", "ledger", "ledger1", extra={"Tags": ["finance", "v1"]})
    register(base, "ui-n5", "payroll", "payroll1", extra={"Tags": ["finance"]})
    open_page(d, base, "/services")
    wait_until("ledger listed", lambda: "ledger" in services_shown(d))
    wait_until("the finance tag offered",
               lambda: "finance" in [o.get_attribute("value") for o in d.find_elements(By.CSS_SELECTOR, "#svc-tag option")])
    Select(d.find_element(By.ID, "svc-tag")).select_by_value("finance")
    assert sorted(services_shown(d)) == ["ledger", "payroll"], services_shown(d)
    # A live update keeps the chosen tag and its filter.
    register(base, "ui-n5", "audit", "audit1", extra={"Tags": ["finance"]})
    wait_until("audit joins the filtered list", lambda: sorted(services_shown(d)) == ["audit", "ledger", "payroll"])
    assert Select(d.find_element(By.ID, "svc-tag")).first_selected_option.get_attribute("value") == "finance"
    Select(d.find_element(By.ID, "svc-tag")).select_by_value("")
    assert "web" in services_shown(d)


def test_a_config_entry_shown_as_hcl_writes_back_through_the_cli(cluster, browser, tmp_path):
    base = cluster.url
    d = browser
    entry = {"Kind": "service-router", "Name": "hclsvc", "Meta": {"owner.team": "ops"},
             "Routes": [{"Match": {"HTTP": {"PathPrefix": "/v2", "Header": [{"Name": "x-canary", "Exact": "1"}]}},
                         "Destination": {"Service": "hclsvc", "RetryOn": ["5xx"], "NumRetries": 2}}]}
    assert call(base, "PUT", "/v1/config", {"Kind": "service-defaults", "Name": "hclsvc", "Protocol": "http"}) is True
    assert call(base, "PUT", "/v1/config", entry) is True
    open_page(d, base, "/config/service-router/hclsvc")
    wait_until("the JSON", lambda: '"PathPrefix": "/v2"' in text_of(d, "#config-body"))
    d.find_element(By.ID, "config-as-hcl").click()
    wait_until("the HCL", lambda: 'PathPrefix = "/v2"' in text_of(d, "#config-body"))
    assert d.find_element(By.ID, "config-as-hcl").get_attribute("aria-pressed") == "true"
    shot(d, "config-hcl")
    text = d.find_element(By.ID, "config-body").get_attribute("textContent")
    assert "ModifyIndex" not in text
    # What the page shows is a file `cairn config write` takes: delete the
    # entry, write the shown HCL back, and the same entry returns.
    before = call(base, "GET", "/v1/config/service-router/hclsvc")
    assert call(base, "DELETE", "/v1/config/service-router/hclsvc") is True
    f = tmp_path / "router.hcl"
    f.write_text(text)
    import subprocess
    from conftest import cairn_bin
    env = dict(os.environ, CONSUL_HTTP_ADDR=base)
    out = subprocess.run([cairn_bin(), "config", "write", str(f)], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr + out.stdout
    after = call(base, "GET", "/v1/config/service-router/hclsvc")
    strip = lambda e: {k: v for k, v in e.items() if k not in ("CreateIndex", "ModifyIndex")}
    assert strip(after) == strip(before)


@pytest.fixture(scope="module")
def dc2(cluster):
    """A one-server datacenter dc2 joined to the cluster (dc1) over the WAN."""
    s = CairnServer(extra=("--datacenter", "dc2", "--primary-datacenter", "dc1", "--ui",
                           "--encrypt", FEDERATION_KEY,
                           "--join-wan", f"127.0.0.1:{cluster.raft[0]}"))
    wait_until("dc1 knows dc2", lambda: "dc2" in call(cluster.url, "GET", "/v1/catalog/datacenters"), 30)
    yield s
    s.stop()


def test_the_datacenter_selector_shows_the_other_datacenter(cluster, dc2, browser):
    base = cluster.url
    d = browser
    register(dc2.url, "dc2-n1", "far-away", "far1")
    open_page(d, base, "/services")
    wait_until("web listed", lambda: "web" in services_shown(d))
    wait_until("dc2 offered", lambda: "dc2" in [o.get_attribute("value") for o in d.find_elements(By.CSS_SELECTOR, "#dc option")])
    assert Select(d.find_element(By.ID, "dc")).first_selected_option.get_attribute("value") == "dc1"
    assert "far-away" not in services_shown(d)
    Select(d.find_element(By.ID, "dc")).select_by_value("dc2")
    wait_until("dc2's services", lambda: "far-away" in services_shown(d) and "web" not in services_shown(d))
    # Live there too: a service registered in dc2 appears without reload.
    register(dc2.url, "dc2-n1", "far-later", "far2")
    wait_until("far-later live", lambda: "far-later" in services_shown(d))
    shot(d, "services-dc2")
    # The choice holds across pages of the tab, and back to dc1 restores it.
    open_page(d, base, "/services/far-away")
    wait_until("the dc2 instance", lambda: "far-away is passing" in text_of(d, "#service-body"))
    open_page(d, base, "/services")
    Select(d.find_element(By.ID, "dc")).select_by_value("dc1")
    wait_until("dc1 again", lambda: "web" in services_shown(d) and "far-away" not in services_shown(d))
    assert not console_errors(d), console_errors(d)
