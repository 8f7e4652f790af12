// Verifies webhook messages with the Standard Webhooks reference library
// for Node (standardwebhooks), not identityd's code. Reads a JSON array of
// {secret, headers, body} from stdin; writes a JSON array of results,
// {ok: true, type} or {ok: false, error}, in the same order. Driven by
// e2e/webhooks_test.go.
import { Webhook } from 'standardwebhooks';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const messages = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const results = messages.map(({ secret, headers, body }) => {
  try {
    const payload = new Webhook(secret).verify(body, headers);
    return { ok: true, type: payload.type };
  } catch (err) {
    return { ok: false, error: String(err && err.message) };
  }
});
process.stdout.write(JSON.stringify(results));
