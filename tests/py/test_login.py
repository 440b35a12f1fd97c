"""Auth methods, binding rules, login and logout with real token issuers:
JWTs made and signed by PyPI's pyjwt with `cryptography` keys (RS256,
ES256), their keys given to cairn as static `JWTValidationPubKeys` and as a
JWKS served over HTTPS by this test (certificate made by `cairn tls`);
Nomad's workload-identity flow (the auth method and binding rules that
`nomad setup consul` creates); and the Kubernetes method against a
stand-in of the TokenReview API (no Kubernetes API server runs here: the
stand-in answers `/apis/authentication.k8s.io/v1/tokenreviews` exactly as
Kubernetes documents it). Every refused login leaves no token behind and
no ACL write."""

import base64
import hashlib
import hmac
import http.server
import json
import pathlib
import ssl
import subprocess
import tempfile
import threading
import time
import uuid

import consul
import jwt
import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from conftest import acl_server, cairn_bin

ROOT = str(uuid.uuid4())


def pem_public(key):
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
RSA_KEY2 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def claims(**extra):
    now = int(time.time())
    c = {"iss": "https://issuer.test", "aud": "consul.io", "iat": now, "nbf": now, "exp": now + 300}
    c.update(extra)
    return {k: v for k, v in c.items() if v is not None}


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class HttpsStandIn:
    """A local HTTPS server answering with `handle(method, path, headers,
    body) -> (status, bytes)`; counts the requests it got."""

    def __init__(self, certs, handle):
        outer = self
        self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                outer.requests.append((self.command, self.path, dict(self.headers), body))
                status, out = handle(self.command, self.path, self.headers, body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certs["cert"], certs["key"])
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture(scope="module")
def server():
    s = acl_server(ROOT)
    yield s
    s.stop()


def root(server):
    host, port = server.addr.split(":")
    return consul.Consul(host=host, port=int(port), token=ROOT)


def as_token(server, secret):
    host, port = server.addr.split(":")
    return consul.Consul(host=host, port=int(port), token=secret)


def raw_login(server, method, bearer, meta=None):
    body = {"AuthMethod": method, "BearerToken": bearer}
    if meta:
        body["Meta"] = meta
    return requests.post(f"{server.url}/v1/acl/login", json=body, timeout=30)


def acl_state(server):
    """The tokens there are and the ACL tables' index."""
    r = requests.get(f"{server.url}/v1/acl/tokens", headers={"X-Consul-Token": ROOT}, timeout=10)
    r.raise_for_status()
    return sorted(t["AccessorID"] for t in r.json()), r.headers["X-Consul-Index"]


STATIC = "static-keys"


@pytest.fixture(scope="module")
def static_method(server):
    c = root(server)
    c.acl.auth_method.create(
        name=STATIC, method_type="jwt", max_token_ttl="10m",
        config={
            "JWTValidationPubKeys": [pem_public(RSA_KEY), pem_public(EC_KEY)],
            "JWTSupportedAlgs": ["RS256", "ES256"],
            "BoundIssuer": "https://issuer.test",
            "BoundAudiences": ["consul.io"],
            "ClaimMappings": {"service": "service", "team": "team"},
            "ListClaimMappings": {"groups": "groups"},
        })
    c.acl.policy.create("ops-read", rules={"node_prefix": {"": {"policy": "read"}}})
    c.acl.role.create(name="ops", policies_name=["ops-read"])
    c.acl.binding_rule.create(auth_method=STATIC, bind_type="service", bind_name="${value.service}",
                              selector='value.team == "web"')
    c.acl.binding_rule.create(auth_method=STATIC, bind_type="role", bind_name="ops",
                              selector='"ops" in list.groups')
    return STATIC


def test_a_jwt_login_makes_a_token_of_the_matching_rules_and_logout_deletes_it(server, static_method):
    for key, alg in ((RSA_KEY, "RS256"), (EC_KEY, "ES256")):
        bearer = jwt.encode(claims(service="Web-API", team="web", groups=["ops"]), key, algorithm=alg)
        c = as_token(server, None)
        t = c.acl.login(auth_method=static_method, bearer_token=bearer, meta={"host": "h1"})
        assert t["AuthMethod"] == static_method
        assert t["Local"] is True
        # Consul lowercases an interpolated service name.
        assert t["ServiceIdentities"] == [{"ServiceName": "web-api"}]
        assert [r["Name"] for r in t["Roles"]] == ["ops"]
        assert t["Description"] == 'token created via login: {"host":"h1"}'
        # MaxTokenTTL bounds the token's life.
        assert "ExpirationTime" in t
        me = as_token(server, t["SecretID"])
        assert me.acl.token.read_self()["AccessorID"] == t["AccessorID"]
        listed = root(server).acl.token.list(authmethod=static_method)
        assert t["AccessorID"] in [x["AccessorID"] for x in listed]
        assert me.acl.logout(token=t["SecretID"]) is True
        with pytest.raises(consul.ConsulException):
            me.acl.token.read_self()


def test_the_login_token_registers_exactly_its_service(server, static_method):
    bearer = jwt.encode(claims(service="billing", team="web"), RSA_KEY, algorithm="RS256")
    t = as_token(server, None).acl.login(auth_method=static_method, bearer_token=bearer)
    me = as_token(server, t["SecretID"])
    assert me.agent.service.register("billing", service_id="billing-1", port=80) is True
    with pytest.raises(consul.ACLPermissionDenied):
        me.agent.service.register("payments", service_id="payments-1", port=80)
    me.agent.service.deregister("billing-1")
    me.acl.logout(token=t["SecretID"])


def forged_tokens():
    """(case, bearer) pairs each login must refuse."""
    good = claims(service="web", team="web")
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps(good).encode())
    # The algorithm-confusion attack: HS256 keyed with the RSA public key.
    mac = hmac.new(pem_public(RSA_KEY).encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    none_header = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    now = int(time.time())
    return [
        ("signed by another key", jwt.encode(good, OTHER_KEY, algorithm="RS256")),
        ("alg none", f"{none_header}.{body}."),
        ("HS256 with the public key as secret", f"{header}.{body}.{b64(mac)}"),
        ("expired", jwt.encode(claims(service="web", team="web", exp=now - 3600, iat=now - 7200, nbf=now - 7200),
                               RSA_KEY, algorithm="RS256")),
        ("not yet valid", jwt.encode(claims(service="web", team="web", nbf=now + 3600), RSA_KEY, algorithm="RS256")),
        ("wrong issuer", jwt.encode(claims(service="web", team="web", iss="https://evil.test"), RSA_KEY,
                                    algorithm="RS256")),
        ("wrong audience", jwt.encode(claims(service="web", team="web", aud="other"), RSA_KEY, algorithm="RS256")),
        ("no rule matches", jwt.encode(claims(service="web", team="db"), RSA_KEY, algorithm="RS256")),
        ("bind name interpolates to an invalid name",
         jwt.encode(claims(service="web/../admin", team="web"), RSA_KEY, algorithm="RS256")),
        ("a 1 MiB bearer token", "a" * (1 << 20)),
        ("not a JWT", "garbage"),
    ]


@pytest.mark.parametrize("case,bearer", forged_tokens(), ids=[c for c, _ in forged_tokens()])
def test_a_forged_or_unbound_credential_is_refused_and_writes_nothing(server, static_method, case, bearer):
    before = acl_state(server)
    r = raw_login(server, static_method, bearer)
    assert r.status_code in (400, 403, 413), (case, r.status_code, r.text)
    assert acl_state(server) == before, case


def test_logout_takes_only_a_login_token(server, static_method):
    plain = root(server).acl.token.create(description="not a login")
    r = requests.post(f"{server.url}/v1/acl/logout", headers={"X-Consul-Token": plain["SecretID"]}, timeout=10)
    assert r.status_code == 403, r.text
    assert root(server).acl.token.read(plain["AccessorID"])["AccessorID"] == plain["AccessorID"]
    r = requests.post(f"{server.url}/v1/acl/logout", headers={"X-Consul-Token": str(uuid.uuid4())}, timeout=10)
    assert r.status_code == 403
    r = requests.post(f"{server.url}/v1/acl/logout", timeout=10)
    assert r.status_code == 403


def test_a_token_one_permission_short_cannot_manage_auth_methods(server, static_method):
    c = root(server)
    c.acl.policy.create("acl-reader", rules={"acl": "read"})
    reader = as_token(server, c.acl.token.create(policies_name=["acl-reader"])["SecretID"])
    assert [m["Name"] for m in reader.acl.auth_method.list()] == [static_method]
    assert "Config" not in reader.acl.auth_method.list()[0]
    with pytest.raises(consul.ACLPermissionDenied):
        reader.acl.auth_method.create(name="mine", method_type="jwt",
                                      config={"JWTValidationPubKeys": [pem_public(RSA_KEY)]})
    with pytest.raises(consul.ACLPermissionDenied):
        reader.acl.binding_rule.create(auth_method=static_method, bind_type="role", bind_name="ops")
    with pytest.raises(consul.ACLPermissionDenied):
        as_token(server, None).acl.auth_method.list()


def test_bad_methods_and_rules_are_refused_with_the_reason(server, static_method):
    def put(path, body):
        return requests.put(f"{server.url}{path}", json=body, headers={"X-Consul-Token": ROOT}, timeout=10)

    r = put("/v1/acl/auth-method", {"Name": "x", "Type": "jwt", "Config": {}})
    assert r.status_code == 400 and "exactly one of" in r.text
    r = put("/v1/acl/auth-method", {"Name": "x", "Type": "jwt", "Config": {"JWTValidationPubKeys": ["junk"]}})
    assert r.status_code == 400 and "JWTValidationPubKeys" in r.text
    r = put("/v1/acl/auth-method", {"Name": "x", "Type": "ldap", "Config": {}})
    assert r.status_code == 400
    r = put("/v1/acl/auth-method", {"Name": "x y", "Type": "jwt",
                                    "Config": {"JWTValidationPubKeys": [pem_public(RSA_KEY)]}})
    assert r.status_code == 400 and "invalid Name" in r.text
    r = put("/v1/acl/binding-rule", {"AuthMethod": static_method, "BindType": "service",
                                     "BindName": "${value.nope}"})
    assert r.status_code == 400, r.text
    r = put("/v1/acl/binding-rule", {"AuthMethod": static_method, "BindType": "service",
                                     "BindName": "web", "Selector": "serviceaccount.name == x"})
    assert r.status_code == 400 and "Selector is invalid" in r.text
    r = put("/v1/acl/binding-rule", {"AuthMethod": "nope", "BindType": "service", "BindName": "web"})
    assert r.status_code == 400 and "unknown AuthMethod" in r.text
    r = put(f"/v1/acl/auth-method/{static_method}", {"Name": static_method, "Type": "kubernetes"})
    assert r.status_code == 400 and "immutable" in r.text


def test_deleting_a_method_deletes_its_rules_and_tokens_and_refuses_its_logins(server):
    c = root(server)
    c.acl.auth_method.create(name="short-lived", method_type="jwt",
                             config={"JWTValidationPubKeys": [pem_public(EC_KEY)],
                                     "JWTSupportedAlgs": ["ES256"], "ClaimMappings": {"service": "service"}})
    c.acl.binding_rule.create(auth_method="short-lived", bind_type="service", bind_name="${value.service}")
    bearer = jwt.encode(claims(service="api"), EC_KEY, algorithm="ES256")
    t = as_token(server, None).acl.login(auth_method="short-lived", bearer_token=bearer)
    assert c.acl.auth_method.delete(name="short-lived") is True
    assert c.acl.binding_rule.list(auth_method="short-lived") == []
    with pytest.raises(consul.ConsulException):
        as_token(server, t["SecretID"]).acl.token.read_self()
    before = acl_state(server)
    r = raw_login(server, "short-lived", bearer)
    assert r.status_code == 403 and "not found" in r.text
    assert acl_state(server) == before


# ---- Nomad's workload identities, keys from a JWKS over HTTPS ----

def jwk(key, kid):
    return {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key())), "kid": kid, "use": "sig",
            "alg": "RS256"}


def test_nomad_workload_identities_log_in_through_a_jwks(server, certs):
    served = {"keys": [jwk(RSA_KEY, "k1")]}
    jwks = HttpsStandIn(certs, lambda m, p, h, b: (200, json.dumps(served).encode())
                        if p == "/.well-known/jwks.json" else (404, b"{}"))
    elsewhere = HttpsStandIn(certs, lambda m, p, h, b: (200, json.dumps(served).encode()))
    try:
        c = root(server)
        # What `nomad setup consul` creates.
        c.acl.auth_method.create(
            name="nomad-workloads", method_type="jwt", description="login method for Nomad workload identities",
            config={
                "JWKSURL": f"{jwks.url}/.well-known/jwks.json",
                "JWKSCACert": certs["ca"],
                "JWTSupportedAlgs": ["RS256"],
                "BoundAudiences": ["consul.io"],
                "ClaimMappings": {"nomad_namespace": "nomad_namespace", "nomad_job_id": "nomad_job_id",
                                  "nomad_task": "nomad_task", "nomad_service": "nomad_service"},
            })
        c.acl.binding_rule.create(auth_method="nomad-workloads", bind_type="service",
                                  bind_name="${value.nomad_service}", selector='"nomad_service" in value',
                                  description="binding rule for Nomad workload identities (WI)")
        c.acl.policy.create("nomad-default-tasks", rules={"key_prefix": {"nomad/": {"policy": "read"}}})
        c.acl.role.create(name="nomad-default-tasks", policies_name=["nomad-default-tasks"])
        c.acl.binding_rule.create(auth_method="nomad-workloads", bind_type="role",
                                  bind_name="nomad-${value.nomad_namespace}-tasks",
                                  selector='"nomad_service" not in value')

        def wi(kid, key=RSA_KEY, **extra):
            return jwt.encode(claims(nomad_namespace="default", nomad_job_id="web", **extra), key,
                              algorithm="RS256", headers={"kid": kid})

        svc = as_token(server, None).acl.login(auth_method="nomad-workloads",
                                               bearer_token=wi("k1", nomad_service="web-svc"))
        assert svc["ServiceIdentities"] == [{"ServiceName": "web-svc"}]
        assert svc["Roles"] == []
        me = as_token(server, svc["SecretID"])
        assert me.agent.service.register("web-svc", service_id="web-svc-1", port=8080) is True
        with pytest.raises(consul.ACLPermissionDenied):
            me.agent.service.register("db", service_id="db-1", port=5432)
        task = as_token(server, None).acl.login(auth_method="nomad-workloads",
                                                bearer_token=wi("k1", nomad_task="web"))
        assert [r["Name"] for r in task["Roles"]] == ["nomad-default-tasks"]
        assert "ServiceIdentities" not in task
        fetched = len(jwks.requests)
        assert fetched >= 1
        # Keys are cached: another login fetches nothing.
        as_token(server, None).acl.login(auth_method="nomad-workloads", bearer_token=wi("k1", nomad_task="web"))
        assert len(jwks.requests) == fetched

        # Nomad rotates its key: a token with the new kid makes cairn fetch
        # the JWKS again (at most once a second), then it logs in.
        served["keys"].append(jwk(RSA_KEY2, "k2"))
        bearer = wi("k2", key=RSA_KEY2, nomad_task="web")
        deadline = time.time() + 10
        while raw_login(server, "nomad-workloads", bearer).status_code != 200:
            assert time.time() < deadline, "the rotated key was never fetched"
            time.sleep(0.2)

        # A kid naming a URL is only a key ID: nothing is fetched from it.
        before = acl_state(server)
        r = raw_login(server, "nomad-workloads", wi(f"{elsewhere.url}/keys", key=OTHER_KEY, nomad_task="web"))
        assert r.status_code == 403
        assert elsewhere.requests == []
        assert acl_state(server) == before
    finally:
        jwks.close()
        elsewhere.close()


def test_a_jwks_server_with_another_ca_is_not_trusted(server, certs):
    stand_in = HttpsStandIn(certs, lambda m, p, h, b: (200, json.dumps({"keys": [jwk(RSA_KEY, "k1")]}).encode()))
    try:
        other_ca = tempfile.TemporaryDirectory()
        subprocess.run([cairn_bin(), "tls", "ca", "create"], cwd=other_ca.name, check=True, capture_output=True)
        ca = (pathlib.Path(other_ca.name) / "consul-agent-ca.pem").read_text()
        root(server).acl.auth_method.create(
            name="untrusted-jwks", method_type="jwt",
            config={"JWKSURL": f"{stand_in.url}/keys", "JWKSCACert": ca, "ClaimMappings": {"s": "s"}})
        root(server).acl.binding_rule.create(auth_method="untrusted-jwks", bind_type="service",
                                             bind_name="${value.s}")
        before = acl_state(server)
        r = raw_login(server, "untrusted-jwks",
                      jwt.encode(claims(s="web"), RSA_KEY, algorithm="RS256", headers={"kid": "k1"}))
        assert r.status_code == 403, r.text
        assert acl_state(server) == before
    finally:
        stand_in.close()


# ---- Kubernetes, against a stand-in of the TokenReview API ----

REVIEWER = jwt.encode({"sub": "system:serviceaccount:kube-system:consul-auth-method"}, OTHER_KEY,
                      algorithm="RS256")


def service_account_token(ns, name):
    return jwt.encode({"iss": "kubernetes/serviceaccount", "sub": f"system:serviceaccount:{ns}:{name}",
                       "kubernetes.io/serviceaccount/namespace": ns,
                       "kubernetes.io/serviceaccount/service-account.name": name}, RSA_KEY, algorithm="RS256")


KNOWN = {service_account_token("default", "web"): ("default", "web", "uid-web"),
         service_account_token("kube-system", "admin"): ("kube-system", "admin", "uid-admin")}


def token_review(method, path, headers, body):
    """The TokenReview API, as Kubernetes documents it: POST a TokenReview,
    authenticated as the reviewer; the answer's status says who the
    reviewed token belongs to."""
    if method != "POST" or path != "/apis/authentication.k8s.io/v1/tokenreviews":
        return 404, b"{}"
    if headers.get("Authorization") != f"Bearer {REVIEWER}":
        return 401, json.dumps({"kind": "Status", "status": "Failure", "reason": "Unauthorized"}).encode()
    review = json.loads(body)
    assert review["kind"] == "TokenReview" and review["apiVersion"] == "authentication.k8s.io/v1"
    who = KNOWN.get(review["spec"]["token"])
    status = {"authenticated": False, "error": "token not valid"} if who is None else {
        "authenticated": True,
        "user": {"username": f"system:serviceaccount:{who[0]}:{who[1]}", "uid": who[2],
                 "groups": ["system:serviceaccounts", f"system:serviceaccounts:{who[0]}"]}}
    return 201, json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                            "spec": review["spec"], "status": status}).encode()


def test_kubernetes_service_accounts_log_in_through_token_review(server, certs):
    api = HttpsStandIn(certs, token_review)
    try:
        c = root(server)
        c.acl.auth_method.create(name="minikube", method_type="kubernetes",
                                 config={"Host": api.url, "CACert": certs["ca"], "ServiceAccountJWT": REVIEWER})
        c.acl.binding_rule.create(auth_method="minikube", bind_type="service",
                                  bind_name="${serviceaccount.name}",
                                  selector='serviceaccount.namespace == "default"')
        t = as_token(server, None).acl.login(auth_method="minikube",
                                             bearer_token=service_account_token("default", "web"))
        assert t["ServiceIdentities"] == [{"ServiceName": "web"}]
        # A service account outside the selected namespace matches no rule.
        before = acl_state(server)
        r = raw_login(server, "minikube", service_account_token("kube-system", "admin"))
        assert r.status_code == 403
        # A token the API does not know.
        r = raw_login(server, "minikube", service_account_token("default", "stranger"))
        assert r.status_code == 403 and "token not valid" in r.text
        assert acl_state(server) == before
    finally:
        api.close()


@pytest.mark.parametrize("answer", ["slow", "garbage", "unauthenticated-reviewer"])
def test_a_slow_or_broken_token_review_api_refuses_within_a_bounded_wait(server, certs, answer):
    def broken(method, path, headers, body):
        if answer == "slow":
            time.sleep(8)
            return token_review(method, path, headers, body)
        if answer == "garbage":
            return 200, b"\x00not json" * 100
        return 401, b'{"kind":"Status","reason":"Unauthorized"}'

    api = HttpsStandIn(certs, broken)
    try:
        name = f"broken-{answer}"
        reviewer = REVIEWER if answer != "unauthenticated-reviewer" else service_account_token("x", "y")
        root(server).acl.auth_method.create(name=name, method_type="kubernetes",
                                            config={"Host": api.url, "CACert": certs["ca"],
                                                    "ServiceAccountJWT": reviewer})
        root(server).acl.binding_rule.create(auth_method=name, bind_type="service",
                                             bind_name="${serviceaccount.name}")
        before = acl_state(server)
        started = time.monotonic()
        r = raw_login(server, name, service_account_token("default", "web"))
        assert r.status_code == 403, r.text
        assert time.monotonic() - started < 7.5
        assert acl_state(server) == before
    finally:
        api.close()


def test_the_cli_creates_a_method_and_a_rule_logs_in_and_out(server, tmp_path):
    def cairn(*args, token=ROOT):
        env = {"PATH": "/usr/bin:/bin", "CAIRN_HTTP_ADDR": server.addr}
        if token:
            env["CAIRN_HTTP_TOKEN"] = token
        return subprocess.run([cairn_bin(), *args], env=env, capture_output=True, text=True, timeout=30)

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"JWTValidationPubKeys": [pem_public(EC_KEY)], "JWTSupportedAlgs": ["ES256"],
                                  "ClaimMappings": {"service": "service"}}))
    r = cairn("acl", "auth-method", "create", "-type", "jwt", "-name", "cli-jwt", "-max-token-ttl", "5m",
              "-config", f"@{config}")
    assert r.returncode == 0, r.stderr
    assert "Type:          jwt" in r.stdout
    r = cairn("acl", "binding-rule", "create", "-method", "cli-jwt", "-bind-type", "service",
              "-bind-name", "${value.service}", "-format", "json")
    assert r.returncode == 0, r.stderr
    rule_id = json.loads(r.stdout)["ID"]
    r = cairn("acl", "binding-rule", "list", "-method", "cli-jwt", "-format", "json")
    assert [x["ID"] for x in json.loads(r.stdout)] == [rule_id]
    bearer = tmp_path / "jwt"
    bearer.write_text(jwt.encode(claims(service="cli-svc"), EC_KEY, algorithm="ES256"))
    sink = tmp_path / "token"
    r = cairn("login", "-method", "cli-jwt", "-bearer-token-file", str(bearer), "-token-sink-file", str(sink),
              "-meta", "host=ci", token=None)
    assert r.returncode == 0, r.stderr
    assert oct(sink.stat().st_mode & 0o777) == "0o600"
    secret = sink.read_text()
    me = as_token(server, secret).acl.token.read_self()
    assert me["ServiceIdentities"] == [{"ServiceName": "cli-svc"}]
    assert me["Description"] == 'token created via login: {"host":"ci"}'
    assert cairn("logout", token=secret).returncode == 0
    with pytest.raises(consul.ConsulException):
        as_token(server, secret).acl.token.read_self()
    # A plain token cannot be logged out.
    assert cairn("logout").returncode != 0
    assert cairn("acl", "auth-method", "delete", "-name", "cli-jwt").returncode == 0
    assert cairn("acl", "auth-method", "read", "-name", "cli-jwt").returncode != 0


def acl_messages():
    """Consul's `hashicorp.consul.acl` Login/Logout messages (its public
    proto), built at run time as consul-dataplane sends them."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="cairn_test_acl.proto", package="hashicorp.consul.acl")

    def message(name, fields):
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, *rest in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=F.LABEL_OPTIONAL)
            if rest:
                f.type_name = rest[0]
    message("LoginRequest", [("auth_method", 1, F.TYPE_STRING), ("bearer_token", 2, F.TYPE_STRING),
                             ("namespace", 4, F.TYPE_STRING), ("partition", 5, F.TYPE_STRING),
                             ("datacenter", 6, F.TYPE_STRING)])
    message("LoginToken", [("accessor_id", 1, F.TYPE_STRING), ("secret_id", 2, F.TYPE_STRING)])
    message("LoginResponse", [("token", 1, F.TYPE_MESSAGE, ".hashicorp.consul.acl.LoginToken")])
    message("LogoutRequest", [("token", 1, F.TYPE_STRING), ("datacenter", 2, F.TYPE_STRING)])
    message("LogoutResponse", [])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"hashicorp.consul.acl.{m.name}"))
            for m in fdp.message_type}


def test_consul_dataplane_logs_in_over_grpc_and_bootstraps_with_its_token(server, static_method):
    import grpc
    from test_xds import call, dataplane_messages
    A, D = acl_messages(), dataplane_messages()
    svc = "/hashicorp.consul.acl.ACLService/"
    # The proxy consul-k8s would have registered for the pod.
    requests.put(
        f"{server.url}/v1/agent/service/register", headers={"X-Consul-Token": ROOT}, timeout=10,
        json={"Kind": "connect-proxy", "ID": "dp-web-sidecar-proxy", "Name": "dp-web-sidecar-proxy", "Port": 21000,
              "Proxy": {"DestinationServiceName": "dp-web", "LocalServicePort": 8080}}).raise_for_status()
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        bearer = jwt.encode(claims(service="dp-web", team="web"), RSA_KEY, algorithm="RS256")
        got = call(ch, svc + "Login", A["LoginRequest"](auth_method=static_method, bearer_token=bearer),
                   A["LoginResponse"])
        secret = got.token.secret_id
        assert got.token.accessor_id
        assert as_token(server, secret).acl.token.read_self()["ServiceIdentities"] == [{"ServiceName": "dp-web"}]
        bootstrap = ch.unary_unary("/hashicorp.consul.dataplane.DataplaneService/GetEnvoyBootstrapParams",
                                   request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=D["BootstrapResponse"].FromString)
        params = bootstrap(D["BootstrapRequest"](node_name="py-node", service_id="dp-web-sidecar-proxy"),
                           metadata=(("x-consul-token", secret),), timeout=10)
        assert params.service == "dp-web"
        # A forged credential is PERMISSION_DENIED and makes no token.
        before = acl_state(server)
        with pytest.raises(grpc.RpcError) as e:
            call(ch, svc + "Login", A["LoginRequest"](auth_method=static_method,
                                                      bearer_token=jwt.encode(claims(service="x", team="web"),
                                                                              OTHER_KEY, algorithm="RS256")),
                 A["LoginResponse"])
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert acl_state(server) == before
        call(ch, svc + "Logout", A["LogoutRequest"](token=secret), A["LogoutResponse"])
        with pytest.raises(consul.ConsulException):
            as_token(server, secret).acl.token.read_self()
        with pytest.raises(grpc.RpcError) as e:
            call(ch, svc + "Logout", A["LogoutRequest"](token=ROOT), A["LogoutResponse"])
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
