// End-to-end tests of identityd's rich authorization requests (RFC 9396,
// authorization_details) with a real third-party OAuth client, openid-client
// v6: a type registered through the admin API and advertised in discovery,
// authorization_details requested in client_credentials grants (both client
// authentication methods), returned in the token response and introspection,
// and refused with invalid_authorization_details.
//
// Driven by the Go e2e harness through environment variables:
//   IDENTITYD_ISSUER               e.g. http://127.0.0.1:PORT (skips when unset)
//   IDENTITYD_ADMIN_CLIENT_ID      bootstrap admin service account
//   IDENTITYD_ADMIN_CLIENT_SECRET
import { after, before, describe, it, test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import * as client from 'openid-client'

import { ADMIN_ID, ADMIN_SECRET, adminGrant, api, basic, configFor, ISSUER, oauthError } from './helpers.mjs'

const sentParams = (call) => new URLSearchParams(call.body)

// ---------------------------------------------------------------- the suite

function defineSuite() {
  describe('identityd RFC 9396 authorization_details + openid-client', { timeout: 60_000 }, () => {
    const TYPE = `payment_initiation_${randomBytes(6).toString('hex')}`
    const LOCATION = 'https://pay.example/payments'
    const paymentType = {
      type: TYPE,
      displayName: 'Payment initiation',
      description: 'Initiate, follow and cancel one payment (node e2e)',
      allowedActions: ['initiate', 'status', 'cancel'],
      allowedLocations: [LOCATION],
      readOnlyActions: ['status'],
      requiredCapabilities: [],
      schema: {
        $schema: 'https://json-schema.org/draft/2020-12/schema',
        type: 'object',
        required: ['type', 'instructedAmount', 'creditorName'],
        properties: {
          type: { const: TYPE },
          instructedAmount: {
            type: 'object',
            required: ['currency', 'amount'],
            properties: {
              currency: { enum: ['EUR', 'USD'] },
              amount: { type: 'string', pattern: '^[0-9]+(\\.[0-9]{1,2})?$' },
            },
          },
          creditorName: { type: 'string' },
        },
      },
    }
    // Two entries of the type: order and every member must come back as sent.
    const details = [
      {
        type: TYPE,
        actions: ['initiate', 'status'],
        locations: [LOCATION],
        instructedAmount: { currency: 'EUR', amount: '123.50' },
        creditorName: 'Merchant A',
        creditorAccount: { iban: 'DE02100100109307118603' },
      },
      {
        type: TYPE,
        actions: ['status'],
        instructedAmount: { currency: 'USD', amount: '7' },
        creditorName: 'Merchant B',
      },
    ]
    const entry = details[0]

    let adminToken // admin access token (plain fetch)
    let meta // server metadata discovered after registering the type
    let typeCreated = false
    let granted // { access_token } of test 2

    before(async () => {
      adminToken = (await adminGrant()).access_token
    })

    it('1. registers a type, and discovery (after) advertises it', async () => {
      const res = await api('POST', '/api/v1/rar/types', adminToken, paymentType)
      assert.equal(res.status, 201, res.text)
      typeCreated = true
      assert.equal(res.json.type, TYPE)
      assert.deepEqual(res.json.allowedActions, paymentType.allowedActions)
      assert.deepEqual(res.json.allowedLocations, paymentType.allowedLocations)
      assert.deepEqual(res.json.schema, paymentType.schema)

      const dup = await api('POST', '/api/v1/rar/types', adminToken, paymentType)
      assert.equal(dup.status, 409, dup.text)

      for (const algorithm of ['oidc', 'oauth2']) {
        const config = await client.discovery(
          new URL(ISSUER),
          ADMIN_ID,
          ADMIN_SECRET,
          client.ClientSecretBasic(ADMIN_SECRET),
          { execute: [client.allowInsecureRequests], algorithm },
        )
        const md = config.serverMetadata()
        assert.equal(md.issuer, ISSUER)
        assert.ok(
          Array.isArray(md.authorization_details_types_supported),
          `${algorithm}: authorization_details_types_supported is not an array`,
        )
        assert.ok(
          md.authorization_details_types_supported.includes(TYPE),
          `${algorithm}: ${TYPE} not in ${JSON.stringify(md.authorization_details_types_supported)}`,
        )
        if (algorithm === 'oidc') meta = md
      }
      assert.ok(meta.introspection_endpoint, 'introspection_endpoint not advertised')
    })

    it('2. clientCredentialsGrant with authorization_details returns them granted', async () => {
      const { config, rec } = configFor(meta, ADMIN_ID, ADMIN_SECRET, 'basic')
      const tokens = await client.clientCredentialsGrant(config, {
        scope: 'users:read',
        authorization_details: JSON.stringify(details),
      })
      const sent = rec.last()
      assert.equal(sent.url, meta.token_endpoint)
      assert.match(sent.headers.get('authorization') ?? '', /^Basic /)
      const params = sentParams(sent)
      assert.equal(params.get('grant_type'), 'client_credentials')
      assert.ok(params.has('authorization_details'), `no authorization_details in ${sent.body}`)
      assert.deepEqual(JSON.parse(params.get('authorization_details')), details)

      assert.equal(sent.status, 200)
      assert.ok(Array.isArray(sent.json.authorization_details), 'raw authorization_details is not an array')
      assert.deepEqual(sent.json.authorization_details, details)
      assert.deepEqual(tokens.authorization_details, details)
      assert.equal(tokens.scope, 'users:read')
      assert.equal(tokens.token_type, 'bearer')
      assert.equal(typeof tokens.access_token, 'string')
      granted = tokens
    })

    it('3. tokenIntrospection shows the granted authorization_details', async () => {
      assert.ok(granted, 'test 2 issued no token')
      const { config, rec } = configFor(meta, ADMIN_ID, ADMIN_SECRET, 'basic')
      const info = await client.tokenIntrospection(config, granted.access_token)
      assert.equal(rec.last().url, meta.introspection_endpoint)
      assert.equal(info.active, true)
      assert.equal(info.client_id, ADMIN_ID)
      assert.equal(info.scope, 'users:read')
      assert.deepEqual(info.authorization_details, details)
      assert.deepEqual(rec.last().json.authorization_details, details)

      // A token issued without authorization_details shows none.
      const plain = await client.clientCredentialsGrant(config, { scope: 'users:read' })
      assert.equal(plain.authorization_details, undefined)
      const plainInfo = await client.tokenIntrospection(config, plain.access_token)
      assert.equal(plainInfo.active, true)
      assert.equal(plainInfo.authorization_details, undefined)
    })

    it('4. refusals are 400 invalid_authorization_details (ResponseBodyError)', async () => {
      const { config, rec } = configFor(meta, ADMIN_ID, ADMIN_SECRET, 'basic')
      const unknownType = `no_such_type_${randomBytes(6).toString('hex')}`
      const cases = [
        {
          name: 'unregistered type',
          value: JSON.stringify([{ ...entry, type: unknownType }]),
          mentions: [unknownType, 'not registered'],
        },
        {
          name: 'action not allowed',
          value: JSON.stringify([{ ...entry, actions: ['initiate', 'refund'] }]),
          // RFC 6749 §5.2 keeps '"' out of error_description, so no quotes here.
          mentions: ['refund', '/actions/1'],
        },
        {
          name: 'location not allowed',
          value: JSON.stringify([{ ...entry, locations: ['https://evil.example/payments'] }]),
          mentions: ['https://evil.example/payments', '/locations/0'],
        },
        {
          name: 'schema violation (amount as a number)',
          value: JSON.stringify([{ ...entry, instructedAmount: { currency: 'EUR', amount: 123.5 } }]),
          mentions: ['/instructedAmount/amount'],
        },
        {
          name: 'second entry invalid',
          value: JSON.stringify([entry, { ...details[1], instructedAmount: { currency: 'GBP', amount: '1' } }]),
          mentions: ['authorization_details[1]', '/instructedAmount/currency'],
        },
        { name: 'malformed JSON', value: '[{', mentions: ['not valid JSON'] },
        { name: 'not an array', value: JSON.stringify(entry), mentions: ['array'] },
        { name: 'empty array', value: '[]', mentions: ['at least one'] },
      ]
      for (const c of cases) {
        const err = await oauthError(
          client.clientCredentialsGrant(config, { scope: 'users:read', authorization_details: c.value }),
        )
        assert.equal(sentParams(rec.last()).get('authorization_details'), c.value, c.name)
        assert.equal(err.status, 400, `${c.name}: ${err}`)
        assert.equal(err.error, 'invalid_authorization_details', `${c.name}: ${err.error}`)
        assert.equal(typeof err.err.error_description, 'string', c.name)
        for (const m of c.mentions) {
          assert.ok(
            err.err.error_description.includes(m),
            `${c.name}: error_description ${JSON.stringify(err.err.error_description)} lacks ${JSON.stringify(m)}`,
          )
        }
        assert.equal(rec.last().json?.error, 'invalid_authorization_details', `${c.name}: raw body`)
        assert.equal(rec.last().json?.access_token, undefined, `${c.name}: a token was issued`)
      }
    })

    it('5. both client authentication methods carry authorization_details', async () => {
      for (const method of ['basic', 'post']) {
        const { config, rec } = configFor(meta, ADMIN_ID, ADMIN_SECRET, method)
        const tokens = await client.clientCredentialsGrant(config, {
          authorization_details: JSON.stringify([entry]),
        })
        const sent = rec.last()
        const params = sentParams(sent)
        if (method === 'post') {
          assert.equal(sent.headers.get('authorization'), null)
          assert.equal(params.get('client_id'), ADMIN_ID)
          assert.equal(params.get('client_secret'), ADMIN_SECRET)
        } else {
          assert.match(sent.headers.get('authorization') ?? '', /^Basic /)
          assert.ok(!params.has('client_secret'))
        }
        assert.deepEqual(JSON.parse(params.get('authorization_details')), [entry])
        assert.deepEqual(tokens.authorization_details, [entry], method)
        assert.deepEqual(sent.json.authorization_details, [entry], `${method}: raw`)

        const info = await client.tokenIntrospection(config, tokens.access_token)
        assert.equal(info.active, true, method)
        assert.deepEqual(info.authorization_details, [entry], `${method}: introspection`)

        const refused = await oauthError(
          client.clientCredentialsGrant(config, {
            authorization_details: JSON.stringify([{ ...entry, actions: ['refund'] }]),
          }),
        )
        assert.equal(refused.status, 400, method)
        assert.equal(refused.error, 'invalid_authorization_details', method)
      }
    })

    after(async () => {
      // Best effort: leave no type behind.
      if (typeCreated && adminToken) await api('DELETE', `/api/v1/rar/types/${TYPE}`, adminToken)
    })
  })
}

if (ISSUER) {
  defineSuite()
} else {
  test('identityd RFC 9396 authorization_details + openid-client', { skip: 'IDENTITYD_ISSUER is not set' }, () => {})
}
