// A real OpenID provider for tests/py/test_oidc.py: npm's `oidc-provider`
// (its development log-in and consent pages, which take any user name)
// over HTTPS with the certificate the test made. One confidential client,
// PKCE required. Every account is in the `web-admins` group but `mallory`.
// Prints "ready" once it listens.
//
// Environment: OIDC_PORT, OIDC_CERT, OIDC_KEY, OIDC_CLIENT_ID,
// OIDC_CLIENT_SECRET, OIDC_REDIRECT_URI.

import fs from "node:fs";
import https from "node:https";

import Provider from "oidc-provider";

const env = process.env;
const issuer = `https://127.0.0.1:${env.OIDC_PORT}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: env.OIDC_CLIENT_ID,
    client_secret: env.OIDC_CLIENT_SECRET,
    redirect_uris: [env.OIDC_REDIRECT_URI],
    response_types: ["code"],
    grant_types: ["authorization_code"],
    token_endpoint_auth_method: "client_secret_basic",
  }],
  pkce: { required: () => true },
  scopes: ["openid", "email", "groups"],
  claims: { email: ["email"], groups: ["groups"] },
  async findAccount(_ctx, id) {
    return {
      accountId: id,
      async claims() {
        return { sub: id, email: `${id}@example.test`, groups: id === "mallory" ? [] : ["web-admins"] };
      },
    };
  },
  cookies: { keys: ["cairn-test-only"] },
  features: { devInteractions: { enabled: true } },
});

https
  .createServer({ cert: fs.readFileSync(env.OIDC_CERT), key: fs.readFileSync(env.OIDC_KEY) }, provider.callback())
  .listen(Number(env.OIDC_PORT), "127.0.0.1", () => console.log("ready"));
