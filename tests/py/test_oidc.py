"""The `oidc` auth method against a real OpenID provider: npm's
`oidc-provider` (tests/node/oidc_provider.mjs, its development log-in and
consent pages) over HTTPS with a certificate made by `cairn tls`. The
authorization code flow with PKCE end to end: `/v1/acl/oidc/auth-url`, the
provider's pages, `/v1/acl/oidc/callback`, the token its binding rules
make; driven by `requests` for the attacker's cases and by headless
Chromium through cairn's web UI (its ACL page's log-in button, back to a
logged-in UI, then the log-out deleting the token). Every refused
callback leaves no token behind and no ACL write."""

import os
import pathlib
import re
import subprocess
import urllib.parse

import pytest
import requests

from conftest import ROOT as REPO, acl_server, chromium, free_port

ROOT = "6f1c2a4e-0000-4000-8000-0000000001dc"
CLIENT_ID = "cairn-ui"
CLIENT_SECRET = "a-test-only-client-secret"
METHOD = "idp"
NODE_DIR = REPO / "tests" / "node"


@pytest.fixture(scope="module")
def server():
    s = acl_server(ROOT, extra=["--ui"])
    yield s
    s.stop()


def redirect_uri(server):
    return f"{server.url}/ui/"


@pytest.fixture(scope="module")
def provider(server, certs):
    """The provider, its one client allowed back only to the server's UI."""
    if not (NODE_DIR / "node_modules" / "oidc-provider").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--silent"], cwd=NODE_DIR, check=True)
    port = free_port()
    env = dict(os.environ, OIDC_PORT=str(port), OIDC_CERT=certs["cert"], OIDC_KEY=certs["key"],
               OIDC_CLIENT_ID=CLIENT_ID, OIDC_CLIENT_SECRET=CLIENT_SECRET,
               OIDC_REDIRECT_URI=redirect_uri(server))
    p = subprocess.Popen(["node", "oidc_provider.mjs"], cwd=NODE_DIR, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.strip() == "ready":
            break
    else:
        raise AssertionError("the OIDC provider never started:\n" + "".join(seen))
    yield f"https://127.0.0.1:{port}"
    p.terminate()
    p.wait(timeout=10)


def api(server, method, path, body=None, token=ROOT):
    headers = {"X-Consul-Token": token} if token else {}
    return requests.request(method, server.url + path, json=body, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def method(server, provider, certs):
    r = api(server, "PUT", "/v1/acl/auth-method", {
        "Name": METHOD, "Type": "oidc", "DisplayName": "Test IdP", "MaxTokenTTL": "1h",
        "Config": {
            "OIDCDiscoveryURL": provider, "OIDCDiscoveryCACert": certs["ca"],
            "OIDCClientID": CLIENT_ID, "OIDCClientSecret": CLIENT_SECRET,
            "AllowedRedirectURIs": [redirect_uri(server)], "OIDCScopes": ["email", "groups"],
            "ClaimMappings": {"sub": "user"}, "ListClaimMappings": {"groups": "groups"},
        }})
    assert r.status_code == 200, r.text
    r = api(server, "PUT", "/v1/acl/binding-rule", {
        "AuthMethod": METHOD, "BindType": "service", "BindName": "dev-${value.user}",
        "Selector": '"web-admins" in list.groups'})
    assert r.status_code == 200, r.text
    return METHOD


def acl_state(server):
    r = api(server, "GET", "/v1/acl/tokens")
    r.raise_for_status()
    return sorted(t["AccessorID"] for t in r.json()), r.headers["X-Consul-Index"]


def auth_url(server, nonce="client-nonce", meta=None, redirect=None):
    r = api(server, "POST", "/v1/acl/oidc/auth-url", {
        "AuthMethod": METHOD, "RedirectURI": redirect or redirect_uri(server),
        "ClientNonce": nonce, "Meta": meta or {}}, token=None)
    assert r.status_code == 200, r.text
    return r.json()["AuthURL"]


def form_action(page):
    m = re.search(r'<form[^>]*action="([^"]+)"', page.text)
    assert m, page.text[:2000]
    return urllib.parse.urljoin(page.url, m.group(1))


def through_provider(url, user, certs):
    """A user's log-in and consent at the provider's own pages, as a
    browser would post them; the query the provider sends back."""
    s = requests.Session()
    s.trust_env = False
    s.verify = certs["ca_file"]
    page = s.get(url, timeout=30)
    page = s.post(form_action(page), data={"prompt": "login", "login": user, "password": "any"}, timeout=30)
    r = s.post(form_action(page), data={"prompt": "consent"}, allow_redirects=False, timeout=30)
    while r.status_code in (302, 303) and r.headers["location"].startswith("https://"):
        r = s.get(urllib.parse.urljoin(r.url, r.headers["location"]), allow_redirects=False, timeout=30)
    assert r.status_code in (302, 303), r.text[:2000]
    back = r.headers["location"]
    assert back.startswith(redirect_uri_of(back)), back
    return dict(urllib.parse.parse_qsl(urllib.parse.urlparse(back).query))


def redirect_uri_of(url):
    u = urllib.parse.urlparse(url)
    return f"{u.scheme}://{u.netloc}{u.path}"


def callback(server, query, nonce="client-nonce", method=METHOD):
    return api(server, "POST", "/v1/acl/oidc/callback", {
        "AuthMethod": method, "State": query.get("state", ""), "Code": query.get("code", ""),
        "ClientNonce": nonce}, token=None)


def test_an_oidc_login_makes_the_token_its_rules_bind_and_logout_deletes_it(server, method, certs):
    url = auth_url(server, meta={"via": "pytest"})
    q = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    # PKCE and a nonce on every request to the provider.
    assert q["code_challenge_method"] == ["S256"] and q["nonce"] and q["state"]
    assert q["client_id"] == [CLIENT_ID] and "openid" in q["scope"][0].split()
    back = through_provider(url, "alice", certs)
    r = callback(server, back)
    assert r.status_code == 200, r.text
    t = r.json()
    assert t["AuthMethod"] == METHOD
    # `groups` reached cairn through the provider's userinfo endpoint.
    assert t["ServiceIdentities"] == [{"ServiceName": "dev-alice"}]
    assert "pytest" in t["Description"]
    assert t["ExpirationTime"]
    assert api(server, "GET", "/v1/acl/token/self", token=t["SecretID"]).status_code == 200
    # The token may register its service and nothing else.
    reg = {"Name": "dev-alice", "ID": "dev-alice-1", "Port": 80}
    assert api(server, "PUT", "/v1/agent/service/register", reg, token=t["SecretID"]).status_code == 200
    other = dict(reg, Name="db", ID="db-1")
    assert api(server, "PUT", "/v1/agent/service/register", other, token=t["SecretID"]).status_code == 403
    r = api(server, "POST", "/v1/acl/logout", token=t["SecretID"])
    assert r.status_code == 200, r.text
    assert api(server, "GET", "/v1/acl/token/self", token=t["SecretID"]).status_code == 403


def test_every_forged_or_replayed_callback_is_refused_and_writes_nothing(server, method, certs):
    before = acl_state(server)
    # Unknown state.
    r = callback(server, {"state": "not-a-state", "code": "x"})
    assert r.status_code == 403, r.text
    # The right code with the wrong client nonce; the state is then spent.
    back = through_provider(auth_url(server), "alice", certs)
    assert callback(server, back, nonce="another").status_code == 403
    assert callback(server, back).status_code == 403
    # A code from one login with the state of another: the provider
    # refuses the exchange (the code is bound to the other's PKCE challenge).
    first = through_provider(auth_url(server), "alice", certs)
    second = through_provider(auth_url(server), "alice", certs)
    r = callback(server, {"state": first["state"], "code": second["code"]})
    assert r.status_code == 403 and "token exchange" in r.text, r.text
    # A user no rule binds.
    r = callback(server, through_provider(auth_url(server), "mallory", certs))
    assert r.status_code == 403, r.text
    assert acl_state(server) == before
    # A callback that worked cannot be played again.
    back = through_provider(auth_url(server), "alice", certs)
    ok = callback(server, back)
    assert ok.status_code == 200, ok.text
    assert callback(server, back).status_code == 403
    api(server, "POST", "/v1/acl/logout", token=ok.json()["SecretID"])


def test_the_flow_is_refused_where_it_could_leak(server, method):
    # A redirect address the method does not allow gets no provider URL.
    r = api(server, "POST", "/v1/acl/oidc/auth-url", {
        "AuthMethod": METHOD, "RedirectURI": "https://evil.test/steal"}, token=None)
    assert r.status_code == 400 and "AllowedRedirectURIs" in r.text, r.text
    # A bearer-token login is not this method's way in.
    r = api(server, "POST", "/v1/acl/login", {"AuthMethod": METHOD, "BearerToken": "x.y.z"}, token=None)
    assert r.status_code == 403, r.text
    # The log-in page's list is anyone's, and carries no Config (no secret).
    r = api(server, "GET", "/v1/internal/ui/oidc-auth-methods", token=None)
    assert r.status_code == 200
    assert r.json() == [{"Name": METHOD, "Type": "oidc", "DisplayName": "Test IdP"}]
    assert CLIENT_SECRET not in r.text
    # Reading the method itself needs acl:read.
    assert api(server, "GET", f"/v1/acl/auth-method/{METHOD}", token=None).status_code == 403
    # A method missing its client secret is refused with the reason.
    r = api(server, "PUT", "/v1/acl/auth-method", {
        "Name": "half", "Type": "oidc", "Config": {
            "OIDCDiscoveryURL": "https://idp.test", "OIDCClientID": "c",
            "AllowedRedirectURIs": ["https://x.test/"]}})
    assert r.status_code == 400 and "OIDCClientSecret" in r.text, r.text


def test_the_web_ui_logs_in_through_the_provider_and_out(server, method):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # The browser trusts the provider's test certificate as a user would
    # click through it; cairn itself checks it against the method's CA.
    d = chromium("--ignore-certificate-errors")
    try:
        wait = WebDriverWait(d, 20)
        d.get(f"{server.url}/ui/#/acl")
        wait.until(lambda d: d.find_elements(By.ID, f"oidc-{METHOD}"))
        button = d.find_element(By.ID, f"oidc-{METHOD}")
        assert button.text == "Log in with Test IdP"
        button.click()
        wait.until(lambda d: d.find_elements(By.NAME, "login"))
        d.find_element(By.NAME, "login").send_keys("alice")
        d.find_element(By.NAME, "password").send_keys("any")
        d.find_element(By.CSS_SELECTOR, "form button[type=submit], form [type=submit]").click()
        # The consent page, then back to the UI.
        wait.until(lambda d: "/interaction/" in d.current_url and d.find_elements(
            By.CSS_SELECTOR, "input[name=prompt][value=consent]"))
        d.find_element(By.CSS_SELECTOR, "form button[type=submit], form [type=submit]").click()
        wait.until(lambda d: d.current_url.startswith(server.url)
                   and "Logged in as" in d.find_element(By.ID, "acl-who").text)
        # The address no longer holds the code.
        assert "code=" not in d.current_url and d.current_url.endswith("#/acl")
        secret = d.execute_script("return localStorage.getItem('cairn.token')")
        me = api(server, "GET", "/v1/acl/token/self", token=secret).json()
        assert me["AuthMethod"] == METHOD and me["ServiceIdentities"] == [{"ServiceName": "dev-alice"}]
        d.find_element(By.ID, "acl-logout").click()
        wait.until(lambda d: d.find_elements(By.ID, "acl-anonymous"))
        # Logging out of the UI deleted the login's token.
        assert api(server, "GET", "/v1/acl/token/self", token=secret).status_code == 403
    finally:
        d.quit()
