// End-to-end tests of identityd's workload identity federation (RFC 8693
// token exchange) with a real third-party OAuth client, openid-client v6 and
// its generic grant request: a platform issuer whose JWKS this suite serves
// itself (node:http on 127.0.0.1), an agent the issuer's subject maps to, a
// platform JWT (RS256, then ES256 after a key rotation) exchanged for an
// identityd access token without any client secret, and the refusals of
// unacceptable subject tokens.
//
// Driven by the Go e2e harness through environment variables:
//   IDENTITYD_ISSUER               e.g. http://127.0.0.1:PORT (skips when unset)
//   IDENTITYD_ADMIN_CLIENT_ID      bootstrap admin service account
//   IDENTITYD_ADMIN_CLIENT_SECRET
import { after, before, describe, it, test } from 'node:test'
import assert from 'node:assert/strict'
import { createServer } from 'node:http'
import { generateKeyPairSync, randomBytes, sign } from 'node:crypto'
import * as client from 'openid-client'

import { ADMIN_ID, ADMIN_SECRET, adminGrant, api, BASE, basic, configFor, ISSUER, oauthError, recorder } from './helpers.mjs'

const GRANT = 'urn:ietf:params:oauth:grant-type:token-exchange'
const JWT_TYPE = 'urn:ietf:params:oauth:token-type:jwt'
const ACCESS_TOKEN_TYPE = 'urn:ietf:params:oauth:token-type:access_token'
const AUDIENCE = 'identityd-node'
const NAMESPACE = 'system:serviceaccount:node-e2e'
const WORKER = `${NAMESPACE}:worker`

const sentParams = (call) => new URLSearchParams(call.body)
const b64u = (v) => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v)).toString('base64url')
const now = () => Math.floor(Date.now() / 1000)

// ---------------------------------------------------------------- keys and JWTs

// A signing key: its private KeyObject, its public JWK (with kid and alg) and
// its JWS algorithm.
function rsaKey(kid) {
  const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048 })
  return { kid, alg: 'RS256', privateKey, jwk: { ...publicKey.export({ format: 'jwk' }), kid, alg: 'RS256', use: 'sig' } }
}

function ecKey(kid) {
  const { privateKey, publicKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' })
  return { kid, alg: 'ES256', privateKey, jwk: { ...publicKey.export({ format: 'jwk' }), kid, alg: 'ES256', use: 'sig' } }
}

// A compact JWS of claims signed with key (RS256, or ES256 with the raw
// r||s signature of RFC 7518 §3.4).
function signJwt(key, claims) {
  const input = `${b64u({ alg: key.alg, typ: 'JWT', kid: key.kid })}.${b64u(claims)}`
  const signature =
    key.alg === 'ES256'
      ? sign('sha256', Buffer.from(input), { key: key.privateKey, dsaEncoding: 'ieee-p1363' })
      : sign('sha256', Buffer.from(input), key.privateKey)
  return `${input}.${signature.toString('base64url')}`
}

// A JWKS server on 127.0.0.1 whose key set can be swapped; it counts fetches.
async function startJwksServer() {
  const state = { keys: [], fetches: 0 }
  const server = createServer((req, res) => {
    if (req.method === 'GET' && req.url === '/jwks') {
      state.fetches++
      res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' })
      res.end(JSON.stringify({ keys: state.keys }))
      return
    }
    res.writeHead(404, { 'content-type': 'text/plain' })
    res.end('not found')
  })
  await new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(0, '127.0.0.1', resolve)
  })
  const { port } = server.address()
  return { server, state, origin: `http://127.0.0.1:${port}` }
}

// ---------------------------------------------------------------- the suite

function defineSuite() {
  describe('identityd RFC 8693 workload identity federation + openid-client', { timeout: 60_000 }, () => {
    const suffix = randomBytes(6).toString('hex')
    let adminToken // admin access token (plain fetch)
    let jwks // { server, state, origin }
    let key // the issuer's current signing key
    let oldKey // the key before the rotation
    let agent // created agent ({ id, clientId, clientSecret, ... })
    let issuer // registered issuer
    let mapping // registered mapping
    let meta // discovered server metadata
    let exchange // { config, rec }: the agent's config, no client authentication
    let admin // { config, rec }: the admin's config (introspection)

    // Claims of a token the server accepts; overrides replace or add.
    const claims = (overrides = {}) => {
      const t = now()
      return { iss: jwks.origin, sub: WORKER, aud: AUDIENCE, iat: t, nbf: t, exp: t + 300, ...overrides }
    }
    const exchangeParams = (subjectToken, extra = {}) => ({
      subject_token: subjectToken,
      subject_token_type: JWT_TYPE,
      scope: 'users:read',
      ...extra,
    })

    before(async () => {
      adminToken = (await adminGrant()).access_token

      // The platform issuer: a JWKS with one RSA key.
      jwks = await startJwksServer()
      key = rsaKey(`node-e2e-rsa-${suffix}`)
      jwks.state.keys = [key.jwk]

      const ag = await api('POST', '/api/v1/agents', adminToken, {
        name: `node-e2e-exchange-${suffix}`,
        type: 'service',
        capabilities: ['read_users'],
      })
      assert.equal(ag.status, 201, `create agent: ${ag.text}`)
      agent = ag.json
      for (const k of ['id', 'clientId']) assert.equal(typeof agent[k], 'string', `${k} in ${ag.text}`)

      const is = await api('POST', '/api/v1/workload-identity/issuers', adminToken, {
        name: `node-e2e-${suffix}`,
        issuerUrl: jwks.origin,
        jwksUri: `${jwks.origin}/jwks`,
        platform: 'kubernetes',
        allowedAudiences: [AUDIENCE],
        allowedSubjects: [`${NAMESPACE}:*`],
        maxTokenAgeSeconds: 3600,
      })
      assert.equal(is.status, 201, `create issuer: ${is.text}`)
      issuer = is.json
      assert.equal(typeof issuer.id, 'string', `id in ${is.text}`)
      assert.equal(issuer.issuerUrl, jwks.origin)

      const m = await api('POST', '/api/v1/workload-identity/mappings', adminToken, {
        issuerId: issuer.id,
        agentClientId: agent.clientId,
        subjectPattern: WORKER,
        subjectMatchType: 'exact',
        scopes: ['users:read'],
      })
      assert.equal(m.status, 201, `create mapping: ${m.text}`)
      mapping = m.json
    })

    it('1. discovery lists the token-exchange grant type', async () => {
      const config = await client.discovery(new URL(ISSUER), agent.clientId, undefined, client.None(), {
        execute: [client.allowInsecureRequests],
      })
      meta = config.serverMetadata()
      assert.equal(meta.issuer, ISSUER)
      assert.equal(meta.token_endpoint, `${BASE}/api/v1/oauth/token`)
      assert.ok(Array.isArray(meta.grant_types_supported), 'grant_types_supported is not an array')
      assert.ok(
        meta.grant_types_supported.includes(GRANT),
        `${GRANT} not in ${JSON.stringify(meta.grant_types_supported)}`,
      )
      assert.ok(meta.introspection_endpoint, 'introspection_endpoint not advertised')

      const rec = recorder()
      config[client.customFetch] = rec.fn
      exchange = { config, rec }
      admin = configFor(meta, ADMIN_ID, ADMIN_SECRET, 'basic')
    })

    it('2. exchanges an RS256 platform token with no client secret', async () => {
      assert.ok(exchange, 'discovery (test 1) did not run')
      const { config, rec } = exchange
      const subjectToken = signJwt(key, claims())
      const tokens = await client.genericGrantRequest(config, GRANT, exchangeParams(subjectToken))

      // What the library sent: client_id in the body, no secret anywhere.
      const sent = rec.last()
      assert.equal(sent.url, meta.token_endpoint)
      assert.equal(sent.method, 'POST')
      assert.equal(sent.headers.get('authorization'), null, 'an Authorization header was sent')
      const params = sentParams(sent)
      assert.equal(params.get('grant_type'), GRANT)
      assert.equal(params.get('client_id'), agent.clientId)
      assert.ok(!params.has('client_secret'), 'client_secret was sent')
      assert.equal(params.get('subject_token'), subjectToken)
      assert.equal(params.get('subject_token_type'), JWT_TYPE)
      assert.equal(params.get('scope'), 'users:read')

      // The raw answer.
      assert.equal(sent.status, 200, JSON.stringify(sent.json))
      const raw = sent.json
      assert.equal(raw.issued_token_type, ACCESS_TOKEN_TYPE)
      assert.equal(raw.token_type, 'Bearer', 'raw token_type should be exactly "Bearer"')
      assert.equal(raw.scope, 'users:read')
      assert.equal(raw.agent_id, agent.id)
      assert.equal(typeof raw.trust_level, 'string')
      assert.equal(typeof raw.expires_in, 'number', 'raw expires_in should be a JSON number')
      assert.ok(raw.expires_in > 0, `expires_in ${raw.expires_in}`)
      assert.equal(raw.refresh_token, undefined, 'a token exchange should not issue a refresh token here')

      // The library's parsed answer.
      assert.equal(typeof tokens.access_token, 'string')
      assert.ok(tokens.access_token.length > 0)
      assert.equal(tokens.access_token, raw.access_token)
      assert.equal(tokens.issued_token_type, ACCESS_TOKEN_TYPE)
      assert.equal(tokens.token_type, 'bearer')
      assert.equal(tokens.scope, 'users:read')
      assert.equal(tokens.agent_id, agent.id)
      assert.equal(tokens.expires_in, raw.expires_in)
      assert.ok(jwks.state.fetches > 0, 'the server never fetched the JWKS')

      // The admin may introspect it: the agent's token.
      const info = await client.tokenIntrospection(admin.config, tokens.access_token)
      assert.equal(admin.rec.last().url, meta.introspection_endpoint)
      assert.equal(info.active, true)
      assert.equal(info.client_id, agent.clientId)
      assert.equal(info.scope, 'users:read')
      assert.equal(info.agent_id, agent.id)
      assert.equal(info.trust_level, raw.trust_level)
      if (info.exp !== undefined) assert.ok(info.exp > now(), `exp ${info.exp}`)
    })

    it('3. refuses unacceptable subject tokens with 400 invalid_request', async () => {
      assert.ok(exchange, 'discovery (test 1) did not run')
      const { config, rec } = exchange
      const t = now()
      const cases = [
        {
          name: 'wrong audience',
          token: () => signJwt(key, claims({ aud: 'someone-else' })),
          mentions: ['audience'],
        },
        {
          name: 'wrong audience (array)',
          token: () => signJwt(key, claims({ aud: ['someone-else', 'another'] })),
          mentions: ['audience'],
        },
        {
          name: 'expired',
          token: () => signJwt(key, claims({ iat: t - 600, nbf: t - 600, exp: t - 120 })),
          mentions: ['expired'],
        },
        {
          name: 'unknown issuer',
          token: () => signJwt(key, claims({ iss: `http://127.0.0.2:1/unregistered-${suffix}` })),
          mentions: ['is not registered'],
        },
        {
          name: 'subject without mapping',
          token: () => signJwt(key, claims({ sub: `${NAMESPACE}:unmapped-${suffix}` })),
          mentions: ['no mapping'],
        },
        {
          name: 'signed by another key with the same kid',
          token: () => signJwt(rsaKey(key.kid), claims()),
          mentions: ['signature'],
        },
      ]
      for (const c of cases) {
        const subjectToken = c.token()
        const err = await oauthError(client.genericGrantRequest(config, GRANT, exchangeParams(subjectToken)))
        const sent = rec.last()
        assert.equal(sentParams(sent).get('subject_token'), subjectToken, c.name)
        assert.equal(sent.headers.get('authorization'), null, c.name)
        assert.equal(err.kind, 'body', `${c.name}: expected ResponseBodyError, got ${err.err}`)
        assert.equal(err.status, 400, `${c.name}: ${err.err}`)
        assert.equal(err.error, 'invalid_request', `${c.name}: ${err.error}`)
        const description = err.err.error_description
        assert.equal(typeof description, 'string', c.name)
        for (const m of c.mentions) {
          assert.ok(
            description.includes(m),
            `${c.name}: error_description ${JSON.stringify(description)} lacks ${JSON.stringify(m)}`,
          )
        }
        assert.equal(sent.json?.error, 'invalid_request', `${c.name}: raw body`)
        assert.equal(sent.json?.access_token, undefined, `${c.name}: a token was issued`)
      }

      // The subject token is the only credential: a client secret is refused.
      const withSecret = configFor(meta, agent.clientId, agent.clientSecret, 'post')
      const refused = await oauthError(
        client.genericGrantRequest(withSecret.config, GRANT, exchangeParams(signJwt(key, claims()))),
      )
      assert.equal(sentParams(withSecret.rec.last()).get('client_secret'), agent.clientSecret)
      assert.equal(refused.status, 400, `client_secret_post: ${refused.err}`)
      assert.equal(refused.error, 'invalid_request', 'client_secret_post')
    })

    it('4. key rotation: an ES256 key with a new kid is picked up', async () => {
      assert.ok(exchange, 'discovery (test 1) did not run')
      const { config, rec } = exchange
      // A token naming an unknown key fetches the key set again at most
      // every 5 s (forged key ids must not make identityd hammer the
      // issuer); the refusals of test 3 may have just done so.
      await new Promise((resolve) => setTimeout(resolve, 5500))
      oldKey = key
      key = ecKey(`node-e2e-ec-${suffix}`)
      jwks.state.keys = [key.jwk]
      const fetchesBefore = jwks.state.fetches

      const tokens = await client.genericGrantRequest(config, GRANT, exchangeParams(signJwt(key, claims())))
      const sent = rec.last()
      assert.equal(sent.status, 200, JSON.stringify(sent.json))
      assert.ok(jwks.state.fetches > fetchesBefore, 'the new kid did not make the server fetch the JWKS again')
      assert.equal(tokens.issued_token_type, ACCESS_TOKEN_TYPE)
      assert.equal(tokens.token_type, 'bearer')
      assert.equal(sent.json.token_type, 'Bearer')
      assert.equal(tokens.scope, 'users:read')
      assert.equal(tokens.agent_id, agent.id)

      const info = await client.tokenIntrospection(admin.config, tokens.access_token)
      assert.equal(info.active, true)
      assert.equal(info.client_id, agent.clientId)

      // The retired key is gone from the JWKS: its tokens are refused.
      const old = await oauthError(
        client.genericGrantRequest(config, GRANT, exchangeParams(signJwt(oldKey, claims()))),
      )
      assert.equal(old.status, 400, `old key: ${old.err}`)
      assert.equal(old.error, 'invalid_request')
      assert.ok(
        old.err.error_description?.includes('signature'),
        `old key: error_description ${JSON.stringify(old.err.error_description)}`,
      )
    })

    after(async () => {
      if (jwks) {
        // The server's HTTP client may keep an idle connection open.
        const closed = new Promise((resolve) => jwks.server.close(resolve))
        jwks.server.closeAllConnections()
        await closed
      }
      // Best effort: leave no mapping, issuer or agent behind.
      if (adminToken) {
        if (mapping?.id) await api('DELETE', `/api/v1/workload-identity/mappings/${mapping.id}`, adminToken).catch(() => {})
        if (issuer?.id) await api('DELETE', `/api/v1/workload-identity/issuers/${issuer.id}`, adminToken).catch(() => {})
        if (agent?.id) await api('DELETE', `/api/v1/agents/${agent.id}`, adminToken).catch(() => {})
      }
    })
  })
}

if (ISSUER) {
  defineSuite()
} else {
  test('identityd RFC 8693 workload identity federation + openid-client', { skip: 'IDENTITYD_ISSUER is not set' }, () => {})
}
