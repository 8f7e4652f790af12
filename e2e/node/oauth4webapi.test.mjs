// End-to-end tests of identityd with oauth4webapi used directly: the strict
// low-level library under openid-client, which checks every response against
// the RFCs. Discovery (OpenID and RFC 8414), client credentials with both
// client authentication methods, introspection by a resource server,
// revocation, rich authorization requests (RFC 9396), agent-to-agent token
// exchange (RFC 8693), and the RFC 6749 errors of every endpoint.
//
// Driven by the Go e2e harness through environment variables:
//   IDENTITYD_ISSUER               e.g. http://127.0.0.1:PORT (skips when unset)
//   IDENTITYD_ADMIN_CLIENT_ID      bootstrap admin service account
//   IDENTITYD_ADMIN_CLIENT_SECRET
import { before, describe, it, test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import * as oauth from 'oauth4webapi'

import { adminGrant, api, BASE, ISSUER, oauthError } from './helpers.mjs'

const GRANT_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange'
const ACCESS_TOKEN_TYPE = 'urn:ietf:params:oauth:token-type:access_token'
// RFC 6749 §5.2: error_description is %x20-21 / %x23-5B / %x5D-7E.
const DESCRIPTION = /^[\x20-\x21\x23-\x5B\x5D-\x7E]+$/
const insecure = { [oauth.allowInsecureRequests]: true }
const scopesOf = (s) => (s ?? '').split(' ').filter(Boolean).sort()

function defineSuite() {
  describe('identityd + oauth4webapi', { timeout: 60_000 }, () => {
    const TYPE = `account_information_${randomBytes(6).toString('hex')}`
    const details = [{ type: TYPE, actions: ['read'], locations: ['https://bank.example/accounts'] }]
    let adminToken
    let as // the discovered authorization server
    let sa // a service account: users:read, orgs:read
    let rs // a resource server: tokens:introspect
    let actor // a verified agent that may exchange tokens
    const clientOf = (who) => ({ client_id: who.clientId })

    const grant = async (who, auth, parameters = {}) => {
      const res = await oauth.clientCredentialsGrantRequest(as, clientOf(who), auth, parameters, insecure)
      return oauth.processClientCredentialsResponse(as, clientOf(who), res)
    }
    const introspect = async (token, who = rs) => {
      const res = await oauth.introspectionRequest(as, clientOf(who), oauth.ClientSecretBasic(who.clientSecret), token, insecure)
      return oauth.processIntrospectionResponse(as, clientOf(who), res)
    }

    before(async () => {
      adminToken = (await adminGrant()).access_token
      const create = async (path, body) => {
        const res = await api('POST', path, adminToken, body)
        assert.equal(res.status, 201, res.text)
        return res.json
      }
      sa = await create('/api/v1/service-accounts', { name: 'oauth4webapi-client', scopes: ['users:read', 'orgs:read'] })
      rs = await create('/api/v1/service-accounts', { name: 'oauth4webapi-resource-server', scopes: ['tokens:introspect'] })
      actor = await create('/api/v1/agents', { name: 'oauth4webapi-actor', type: 'autonomous', capabilities: ['a2a_exchange', 'read_users'] })
      for (const trustLevel of ['registered', 'verified']) {
        const res = await api('POST', `/api/v1/agents/${actor.id}/trust`, adminToken, { trustLevel, reason: 'oauth4webapi e2e' })
        assert.equal(res.status, 200, res.text)
      }
      await create('/api/v1/rar/types', {
        type: TYPE,
        displayName: 'Account information',
        description: 'Read accounts (oauth4webapi e2e)',
        allowedActions: ['read'],
        allowedLocations: ['https://bank.example/accounts'],
        readOnlyActions: ['read'],
        requiredCapabilities: [],
        schema: { type: 'object', required: ['type'] },
      })
    })

    it('discovers the server as OpenID Provider and RFC 8414 metadata', async () => {
      for (const algorithm of ['oidc', 'oauth2']) {
        const issuer = new URL(ISSUER)
        const res = await oauth.discoveryRequest(issuer, { algorithm, ...insecure })
        const md = await oauth.processDiscoveryResponse(issuer, res)
        assert.equal(md.issuer, BASE)
        assert.equal(md.token_endpoint, `${BASE}/api/v1/oauth/token`)
        assert.equal(md.introspection_endpoint, `${BASE}/api/v1/oauth/introspect`)
        assert.equal(md.revocation_endpoint, `${BASE}/api/v1/oauth/revoke`)
        assert.ok(md.grant_types_supported.includes(GRANT_EXCHANGE))
        assert.ok(md.authorization_details_types_supported.includes(TYPE))
        as = md
      }
    })

    it('client credentials with client_secret_basic and client_secret_post', async () => {
      for (const auth of [oauth.ClientSecretBasic(sa.clientSecret), oauth.ClientSecretPost(sa.clientSecret)]) {
        const tokens = await grant(sa, auth, { scope: 'users:read' })
        assert.equal(tokens.token_type, 'bearer')
        assert.equal(tokens.scope, 'users:read')
        assert.equal(tokens.expires_in, 3600)
        const all = await grant(sa, auth)
        assert.deepEqual(scopesOf(all.scope), ['orgs:read', 'users:read'])
      }
    })

    it('introspection by a resource server, and by the owner', async () => {
      const { access_token } = await grant(sa, oauth.ClientSecretBasic(sa.clientSecret), { scope: 'users:read' })
      const info = await introspect(access_token)
      assert.equal(info.active, true)
      assert.equal(info.client_id, sa.clientId)
      assert.equal(info.sub, sa.clientId)
      assert.equal(info.scope, 'users:read')
      const res = await oauth.introspectionRequest(as, clientOf(sa), oauth.ClientSecretPost(sa.clientSecret), access_token, insecure)
      assert.equal((await oauth.processIntrospectionResponse(as, clientOf(sa), res)).active, true)
      assert.equal((await introspect('not-a-token')).active, false)
    })

    it('revocation', async () => {
      for (const auth of [oauth.ClientSecretBasic(sa.clientSecret), oauth.ClientSecretPost(sa.clientSecret)]) {
        const { access_token } = await grant(sa, auth)
        const res = await oauth.revocationRequest(as, clientOf(sa), auth, access_token, insecure)
        assert.equal(await oauth.processRevocationResponse(res), undefined)
        assert.equal((await introspect(access_token)).active, false)
      }
    })

    it('rich authorization requests (RFC 9396)', async () => {
      const tokens = await grant(sa, oauth.ClientSecretBasic(sa.clientSecret), {
        scope: 'users:read',
        authorization_details: JSON.stringify(details),
      })
      assert.deepEqual(tokens.authorization_details, details)
      assert.deepEqual((await introspect(tokens.access_token)).authorization_details, details)
    })

    it('token exchange between agents (RFC 8693)', async () => {
      const subject = await grant(sa, oauth.ClientSecretBasic(sa.clientSecret))
      for (const auth of [oauth.ClientSecretBasic(actor.clientSecret), oauth.ClientSecretPost(actor.clientSecret)]) {
        const res = await oauth.genericTokenEndpointRequest(as, clientOf(actor), auth, GRANT_EXCHANGE, {
          subject_token: subject.access_token,
          subject_token_type: ACCESS_TOKEN_TYPE,
          audience: 'https://api.example',
        }, insecure)
        const tokens = await oauth.processGenericTokenEndpointResponse(as, clientOf(actor), res)
        assert.equal(tokens.issued_token_type, ACCESS_TOKEN_TYPE)
        assert.equal(tokens.token_type, 'bearer')
        const info = await introspect(tokens.access_token)
        assert.equal(info.active, true)
        assert.equal(info.client_id, actor.clientId)
        assert.equal(info.sub, sa.clientId)
        assert.deepEqual(info.act, { sub: actor.clientId })
        assert.deepEqual(info.aud, ['https://api.example'])
      }
    })

    it('refusals are RFC 6749 errors with conforming descriptions', async () => {
      const cases = [
        [401, 'invalid_client', () => grant(sa, oauth.ClientSecretBasic('wrong'))],
        [401, 'invalid_client', () => grant(sa, oauth.ClientSecretPost('wrong'))],
        [400, 'invalid_scope', () => grant(sa, oauth.ClientSecretBasic(sa.clientSecret), { scope: 'no"pe\\§ users:read' })],
        [400, 'invalid_authorization_details', () => grant(sa, oauth.ClientSecretBasic(sa.clientSecret), { authorization_details: '[{"type":"nope"}]' })],
        [401, 'invalid_client', () => introspect('x', { ...rs, clientSecret: 'wrong' })],
        [401, 'invalid_client', async () =>
          oauth.processRevocationResponse(await oauth.revocationRequest(as, clientOf(sa), oauth.ClientSecretPost('wrong'), 'x', insecure))],
      ]
      for (const [status, error, request] of cases) {
        const got = await oauthError(request())
        assert.equal(got.status, status, `${error}: ${JSON.stringify(got)}`)
        assert.equal(got.error, error)
        assert.match(got.description, DESCRIPTION)
      }
    })

    it('the OAuth endpoints answer 405 as RFC 6749 errors', async () => {
      for (const url of [as.token_endpoint, as.introspection_endpoint, as.revocation_endpoint]) {
        const res = await fetch(url)
        assert.equal(res.status, 405)
        assert.equal(res.headers.get('allow'), 'POST')
        const body = await res.json()
        assert.equal(body.error, 'invalid_request')
        assert.match(body.error_description, DESCRIPTION)
      }
    })
  })
}

if (!ISSUER) {
  test('identityd + oauth4webapi', { skip: 'IDENTITYD_ISSUER is not set' }, () => {})
} else {
  defineSuite()
}
