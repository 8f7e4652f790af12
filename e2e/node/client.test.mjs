// End-to-end tests of identityd with a real third-party OAuth client:
// openid-client v6 (discovery, client credentials with client_secret_basic and
// client_secret_post, introspection, revocation), plus the service-account API
// through plain fetch.
//
// Driven by the Go e2e harness through environment variables:
//   IDENTITYD_ISSUER               e.g. http://127.0.0.1:PORT (skips when unset)
//   IDENTITYD_ADMIN_CLIENT_ID      bootstrap admin service account
//   IDENTITYD_ADMIN_CLIENT_SECRET
import { after, before, describe, it, test } from 'node:test'
import assert from 'node:assert/strict'
import * as client from 'openid-client'

import { ADMIN_ID, ADMIN_SECRET, adminGrant, api, BASE, basic, configFor, ISSUER, oauthError } from './helpers.mjs'

const ISO_UTC = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$/
const scopesOf = (s) => (s ?? '').split(' ').filter(Boolean).sort()

// ---------------------------------------------------------------- the suite

function defineSuite() {
  describe('identityd + openid-client', { timeout: 60_000 }, () => {
    let adminToken // admin access token (plain fetch)
    let sa // created service account
    let meta // discovered server metadata
    let basicCfg // openid-client config for sa, client_secret_basic

    before(async () => {
      const body = await adminGrant()
      assert.ok(scopesOf(body.scope).includes('admin'), `admin token scope: ${body.scope}`)
      adminToken = body.access_token
    })

    it('a. creates a service account with the admin token', async () => {
      const res = await api('POST', '/api/v1/service-accounts', adminToken, {
        name: 'node-e2e',
        scopes: ['users:read', 'orgs:read'],
      })
      assert.equal(res.status, 201, res.text)
      assert.match(res.headers.get('content-type') ?? '', /^application\/json/)
      sa = res.json
      for (const k of ['id', 'clientId', 'clientSecret', 'name', 'createdAt']) {
        assert.equal(typeof sa[k], 'string', `${k} in ${res.text}`)
        assert.ok(sa[k].length > 0, `${k} is empty`)
      }
      assert.ok('description' in sa, 'description missing')
      assert.ok(Array.isArray(sa.redirectUris), 'redirectUris is not an array')
      assert.equal(sa.name, 'node-e2e')
      assert.deepEqual([...sa.scopes].sort(), ['orgs:read', 'users:read'])
      assert.match(sa.createdAt, ISO_UTC)
      assert.ok(sa.clientSecret.length >= 43, 'secret shorter than 256 bits of base64url')
    })

    it('b. discovers the server (OpenID and RFC 8414 metadata)', async () => {
      const config = await client.discovery(
        new URL(ISSUER),
        sa.clientId,
        sa.clientSecret,
        client.ClientSecretBasic(sa.clientSecret),
        { execute: [client.allowInsecureRequests] },
      )
      meta = config.serverMetadata()
      assert.equal(meta.issuer, ISSUER)
      assert.equal(meta.token_endpoint, `${BASE}/api/v1/oauth/token`)
      assert.equal(meta.introspection_endpoint, `${BASE}/api/v1/oauth/introspect`)
      assert.equal(meta.revocation_endpoint, `${BASE}/api/v1/oauth/revoke`)
      assert.equal(meta.jwks_uri, `${BASE}/.well-known/jwks.json`)
      assert.ok(meta.grant_types_supported?.includes('client_credentials'))
      for (const m of ['client_secret_basic', 'client_secret_post']) {
        assert.ok(meta.token_endpoint_auth_methods_supported?.includes(m), `${m} not advertised`)
      }

      const oauth2 = await client.discovery(
        new URL(ISSUER),
        sa.clientId,
        sa.clientSecret,
        client.ClientSecretBasic(sa.clientSecret),
        { execute: [client.allowInsecureRequests], algorithm: 'oauth2' },
      )
      assert.equal(oauth2.serverMetadata().issuer, ISSUER)
      assert.equal(oauth2.serverMetadata().token_endpoint, meta.token_endpoint)

      basicCfg = configFor(meta, sa.clientId, sa.clientSecret, 'basic')
    })

    it('c. client_credentials with client_secret_basic', async () => {
      const { config, rec } = basicCfg
      const tokens = await client.clientCredentialsGrant(config, { scope: 'users:read' })
      const sent = rec.last()
      assert.match(sent.headers.get('authorization') ?? '', /^Basic /)
      assert.ok(!new URLSearchParams(sent.body).has('client_secret'))

      assert.equal(typeof tokens.access_token, 'string')
      assert.ok(tokens.access_token.length > 0)
      assert.equal(tokens.token_type.toLowerCase(), 'bearer')
      assert.equal(sent.json.token_type, 'Bearer', 'raw token_type should be exactly "Bearer"')
      assert.equal(typeof tokens.expires_in, 'number')
      assert.ok(tokens.expires_in > 3500 && tokens.expires_in <= 3600, `expires_in ${tokens.expires_in}`)
      assert.equal(typeof sent.json.expires_in, 'number', 'raw expires_in should be a JSON number')
      assert.equal(tokens.scope, 'users:read')
      assert.equal(tokens.refresh_token, undefined, 'client_credentials must not issue a refresh token')
    })

    it('d. client_credentials with client_secret_post; omitted scope grants all', async () => {
      const { config, rec } = configFor(meta, sa.clientId, sa.clientSecret, 'post')
      const tokens = await client.clientCredentialsGrant(config, { scope: 'users:read' })
      const sent = rec.last()
      assert.equal(sent.headers.get('authorization'), null)
      assert.equal(new URLSearchParams(sent.body).get('client_secret'), sa.clientSecret)
      assert.equal(tokens.token_type, 'bearer')
      assert.equal(sent.json.token_type, 'Bearer')
      assert.equal(tokens.scope, 'users:read')
      assert.ok(tokens.expires_in > 0)

      const all = await client.clientCredentialsGrant(config)
      assert.ok(!new URLSearchParams(rec.last().body).has('scope'))
      assert.deepEqual(scopesOf(all.scope), ['orgs:read', 'users:read'])
    })

    it('e. a scope the account lacks is invalid_scope', async () => {
      const e = await oauthError(client.clientCredentialsGrant(basicCfg.config, { scope: 'admin' }))
      assert.equal(e.kind, 'body', `expected ResponseBodyError, got ${e.err}`)
      assert.equal(e.status, 400)
      assert.equal(e.error, 'invalid_scope')

      const mixed = await oauthError(
        client.clientCredentialsGrant(basicCfg.config, { scope: 'users:read admin' }),
      )
      assert.equal(mixed.error, 'invalid_scope')
    })

    it('f. a wrong secret is invalid_client (basic and post)', async () => {
      for (const method of ['basic', 'post']) {
        const { config } = configFor(meta, sa.clientId, sa.clientSecret + 'x', method)
        const e = await oauthError(client.clientCredentialsGrant(config, { scope: 'users:read' }))
        assert.equal(e.error, 'invalid_client', `${method}: ${e.err}`)
        assert.equal(e.status, 401, method)
      }
      const { config } = configFor(meta, 'sa_does_not_exist', sa.clientSecret, 'basic')
      const unknown = await oauthError(client.clientCredentialsGrant(config))
      assert.equal(unknown.error, 'invalid_client')
    })

    it('g. introspection, revocation, and whoami refusing the revoked token', async () => {
      const { config } = basicCfg
      const { access_token: token } = await client.clientCredentialsGrant(config, {
        scope: 'users:read',
      })

      const info = await client.tokenIntrospection(config, token)
      assert.equal(info.active, true)
      assert.equal(info.client_id, sa.clientId)
      assert.equal(info.scope, 'users:read')
      if (info.token_type !== undefined) assert.equal(info.token_type.toLowerCase(), 'bearer')
      if (info.exp !== undefined) assert.ok(info.exp > Date.now() / 1000)

      const who = await api('GET', '/api/v1/m2m/whoami', token)
      assert.equal(who.status, 200, who.text)
      assert.equal(who.json.clientId, sa.clientId)
      assert.equal(who.json.id, sa.id)

      await client.tokenRevocation(config, token)

      const revoked = await client.tokenIntrospection(config, token)
      assert.equal(revoked.active, false)
      assert.deepEqual(Object.keys(revoked), ['active'], 'an inactive token reveals nothing else')

      const refused = await api('GET', '/api/v1/m2m/whoami', token)
      assert.equal(refused.status, 401, refused.text)
      assert.match(refused.headers.get('www-authenticate') ?? '', /^Bearer\b.*error="invalid_token"/)

      // RFC 7009 §2.2: revoking an unknown or already revoked token is still 200.
      await client.tokenRevocation(config, token)
      await client.tokenRevocation(config, 'not-a-token')

      const bogus = await client.tokenIntrospection(config, 'not-a-token')
      assert.equal(bogus.active, false)
    })

    it('h. rotation: the old secret fails at once, the new one works', async () => {
      const res = await api('POST', `/api/v1/service-accounts/${sa.id}/rotate`, adminToken)
      assert.equal(res.status, 200, res.text)
      const { clientId, clientSecret, rotatedAt } = res.json
      assert.equal(clientId, sa.clientId)
      assert.equal(typeof clientSecret, 'string')
      assert.notEqual(clientSecret, sa.clientSecret)
      assert.match(rotatedAt, ISO_UTC)

      for (const method of ['basic', 'post']) {
        const { config } = configFor(meta, sa.clientId, sa.clientSecret, method)
        const e = await oauthError(client.clientCredentialsGrant(config, { scope: 'users:read' }))
        assert.equal(e.error, 'invalid_client', `old secret (${method}): ${e.err}`)
      }

      sa.clientSecret = clientSecret
      basicCfg = configFor(meta, sa.clientId, sa.clientSecret, 'basic')
      const tokens = await client.clientCredentialsGrant(basicCfg.config, { scope: 'orgs:read' })
      assert.equal(tokens.scope, 'orgs:read')
      const post = configFor(meta, sa.clientId, sa.clientSecret, 'post')
      const viaPost = await client.clientCredentialsGrant(post.config)
      assert.deepEqual(scopesOf(viaPost.scope), ['orgs:read', 'users:read'])
    })

    it('i. deletion: its tokens and credentials stop working at once', async () => {
      const { access_token: token } = await client.clientCredentialsGrant(basicCfg.config)
      const admin = configFor(meta, ADMIN_ID, ADMIN_SECRET, 'basic')
      assert.equal((await client.tokenIntrospection(admin.config, token)).active, true)

      const del = await api('DELETE', `/api/v1/service-accounts/${sa.id}`, adminToken)
      assert.equal(del.status, 204, del.text)
      assert.equal(del.text, '')

      const info = await client.tokenIntrospection(admin.config, token)
      assert.equal(info.active, false)

      const who = await api('GET', '/api/v1/m2m/whoami', token)
      assert.equal(who.status, 401, who.text)

      const e = await oauthError(client.clientCredentialsGrant(basicCfg.config))
      assert.equal(e.error, 'invalid_client', String(e.err))

      const gone = await api('GET', `/api/v1/service-accounts/${sa.id}`, adminToken)
      assert.equal(gone.status, 404, gone.text)
    })

    after(async () => {
      // Best effort: leave no account behind if a test failed midway.
      if (sa?.id && adminToken) await api('DELETE', `/api/v1/service-accounts/${sa.id}`, adminToken)
    })
  })
}

if (ISSUER) {
  defineSuite()
} else {
  test('identityd + openid-client', { skip: 'IDENTITYD_ISSUER is not set' }, () => {})
}
