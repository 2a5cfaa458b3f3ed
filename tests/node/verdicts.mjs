// The senders' own Node libraries, asked for a verdict on the bytes the receiver is given.
//
// Reads a JSON array of cases on stdin, each {"scheme", "secret", "body" (base64), "headers"
// ([name, value] pairs, in order, names as sent), "now" (unix seconds)}, and prints a JSON array
// of {"accepted": bool, "reason": string}, one per case, in order. The schemes:
//   github   @octokit/webhooks-methods verify() on X-Hub-Signature-256
//   shopify  @shopify/shopify-api webhooks.validate() (the web-api adapter, a fetch Request)
//   linear   @linear/sdk/webhooks LinearWebhookClient.verify() on Linear-Signature
// Linear's check reads the clock: Date.now is set to the case's "now" while it runs.
// A case {"scheme": "github", "sign": true, ...} asks @octokit/webhooks-methods' sign() for the
// X-Hub-Signature-256 of its body instead: {"signature": "sha256=..."}.
import "@shopify/shopify-api/adapters/web-api";
import { ApiVersion, LogSeverity, shopifyApi } from "@shopify/shopify-api";
import { sign as githubSign, verify as githubVerify } from "@octokit/webhooks-methods";
import { LinearWebhookClient } from "@linear/sdk/webhooks";

const realNow = Date.now;

function header(pairs, name) {
  // First value, as the libraries' own header lookups take it; undefined when absent.
  const found = pairs.find(([key]) => key.toLowerCase() === name);
  return found === undefined ? undefined : found[1];
}

async function github(c, body) {
  return githubVerify(c.secret, body.toString("utf8"), header(c.headers, "x-hub-signature-256"));
}

async function shopify(c, body) {
  const api = shopifyApi({
    apiKey: "receiver-tests",
    apiSecretKey: c.secret,
    scopes: [],
    hostName: "receiver.test",
    apiVersion: ApiVersion.October25,
    isEmbeddedApp: false,
    logger: { level: LogSeverity.Error, log: async () => {} },
  });
  const headers = new Headers();
  for (const [name, value] of c.headers) headers.append(name, value);
  const rawRequest = new Request("https://receiver.test/webhooks/shop", {
    method: "POST",
    headers,
    body,
  });
  const result = await api.webhooks.validate({ rawBody: body.toString("utf8"), rawRequest });
  if (!result.valid) throw new Error(`${result.reason} ${result.missingHeaders ?? ""}`.trim());
  return true;
}

async function linear(c, body) {
  Date.now = () => c.now * 1000;
  try {
    return new LinearWebhookClient(c.secret).verify(body, header(c.headers, "linear-signature"));
  } finally {
    Date.now = realNow;
  }
}

const SCHEMES = { github, shopify, linear };

async function verdict(c) {
  const check = SCHEMES[c.scheme];
  if (check === undefined) throw new Error(`unknown scheme ${c.scheme}`);
  try {
    const ok = await check(c, Buffer.from(c.body, "base64"));
    return { accepted: ok === true, reason: ok === true ? "" : "refused" };
  } catch (error) {
    return { accepted: false, reason: String(error.message ?? error) };
  }
}

let input = "";
for await (const chunk of process.stdin) input += chunk;
const out = [];
for (const c of JSON.parse(input)) {
  if (c.sign) {
    const body = Buffer.from(c.body, "base64").toString("utf8");
    out.push({ signature: await githubSign(c.secret, body) });
  } else {
    out.push(await verdict(c));
  }
}
process.stdout.write(JSON.stringify(out));
