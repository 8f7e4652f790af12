// OpenID Connect CIBA, poll mode, end to end with client libraries someone
// else wrote: openid-client v6 (initiateBackchannelAuthentication,
// pollBackchannelAuthenticationGrant, which validates the ID token) and
// oauth4webapi (single polls, to see each error code of CIBA Core §11);
// the person decides in Debian's Chromium (playwright-core) after opening
// the e-mailed link with no session and signing in on the way.
//
// Run by the Go e2e harness (TestCIBAClientAndConsentPageBrowser), which
// starts identityd and an SMTP server, registers the person and the
// user-delegated agent (registered), and serves the e-mailed consent links
// at MAILBOX (GET ?to=ADDRESS&after=N).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import * as client from 'openid-client'
import * as oauth from 'oauth4webapi'
import { accessible, chromiumSuite, shot, viewports } from './browser.mjs'

const env = process.env
const ISSUER = env.IDENTITYD_ISSUER
const chromiumBrowser = chromiumSuite()
const insecure = { [oauth.allowInsecureRequests]: true }

let config // openid-client's, for the agent
let as // the discovered metadata, for oauth4webapi
let context // the person's browser, signed in once
const agent = { client_id: env.AGENT_ID }
const agentAuth = oauth.ClientSecretBasic(env.AGENT_SECRET)

async function mailedLink(n) {
  const deadline = Date.now() + 15000
  for (;;) {
    const r = await fetch(`${env.MAILBOX}?to=${encodeURIComponent(env.EMAIL)}&after=${n}`)
    if (r.status === 200) return (await r.json()).link
    if (Date.now() > deadline) throw new Error(`no consent e-mail to ${env.EMAIL}`)
    await new Promise((ok) => setTimeout(ok, 100))
  }
}

// One poll, as oauth4webapi sees it: the tokens, or the OAuth error code.
async function pollOnce(authReqId) {
  const res = await oauth.backchannelAuthenticationGrantRequest(as, agent, agentAuth, authReqId, insecure)
  try {
    return { tokens: await oauth.processBackchannelAuthenticationGrantResponse(as, agent, res) }
  } catch (e) {
    if (e instanceof oauth.ResponseBodyError) return { error: e.error, status: e.status }
    throw e
  }
}

function checkHeaders(response) {
  const csp = response.headers()['content-security-policy']
  assert.match(csp, /default-src 'none'.*form-action 'self'.*frame-ancestors 'none'/)
  assert.doesNotMatch(csp, /script-src/)
  assert.equal(response.headers()['cache-control'], 'no-store')
  assert.equal(response.headers()['x-frame-options'], 'DENY')
}

test('discovery advertises CIBA poll mode', async () => {
  config = await client.discovery(new URL(ISSUER), env.AGENT_ID, undefined, client.ClientSecretBasic(env.AGENT_SECRET), {
    execute: [client.allowInsecureRequests],
  })
  as = config.serverMetadata()
  assert.equal(as.backchannel_authentication_endpoint, `${ISSUER}/api/v1/oauth/bc-authorize`)
  assert.deepEqual(as.backchannel_token_delivery_modes_supported, ['poll'])
  assert.ok(as.grant_types_supported.includes('urn:openid:params:grant-type:ciba'))
})

test('pending, slow_down, then the person signs in from the e-mail and approves', async () => {
  // A week (identityd's delegation_expires_in): longer than the access
  // token, so the agent gets a refresh token bound to the delegation.
  const asked = await client.initiateBackchannelAuthentication(config, {
    scope: 'openid email users:read', login_hint: env.EMAIL, binding_message: 'W4SCT', delegation_expires_in: '604800',
  })
  assert.equal(typeof asked.auth_req_id, 'string')
  assert.ok(asked.auth_req_id.length >= 43, 'at least 256 bits')
  assert.equal(asked.interval, 5)
  assert.equal(asked.expires_in, 600)
  assert.equal(asked.delegation_expires_in, 604800)

  // CIBA Core §11: authorization_pending while the person has not
  // decided; slow_down when polled faster than the interval.
  assert.deepEqual(await pollOnce(asked.auth_req_id), { error: 'authorization_pending', status: 400 })
  assert.deepEqual(await pollOnce(asked.auth_req_id), { error: 'slow_down', status: 400 })

  // No session: the e-mailed link leads through the hosted sign-in and back.
  context = await chromiumBrowser().newContext({ viewport: viewports.desktop })
  const page = await context.newPage()
  const link = await mailedLink(0)
  assert.ok(link.startsWith(`${ISSUER}/delegations/consent/`))
  await page.goto(link)
  await page.getByLabel('Email').fill(env.EMAIL)
  await page.getByRole('button', { name: 'Continue' }).click()
  await page.getByLabel('Password').fill(env.PASSWORD)
  await page.getByRole('button', { name: 'Sign in' }).click()
  await page.waitForURL(link)
  await page.getByRole('heading', { name: 'Let an agent act for you?' }).waitFor()
  const response = await page.reload()
  assert.equal(response.status(), 200)
  checkHeaders(response)
  assert.equal(await page.textContent('#agent-name'), env.AGENT_NAME)
  assert.match(await page.textContent('#agent-facts'), /user-delegated, trust level registered/)
  assert.equal(await page.textContent('#binding-message'), 'W4SCT')
  const scopes = await page.locator('#scopes li').allTextContents()
  assert.deepEqual(scopes, [
    'Know who you are by your user id (openid)',
    'See your e-mail address and whether it is verified (email)',
    'Read the user directory (users:read)',
  ])
  assert.match(await page.textContent('#lifetime'), /^7 days after you approve/)
  assert.equal(await page.textContent('#status'), 'pending')
  // Keyboard: the first button is Approve, reachable by Tab.
  assert.equal(await page.getByRole('button', { name: 'Approve' }).count(), 1)
  await accessible(page, 'the consent page')
  await shot(page, 'consent-1-pending')
  if (env.SCREENS_DIR) {
    await page.setViewportSize({ width: viewports.phone.width, height: viewports.phone.height })
    await shot(page, 'consent-phone-1-pending')
    await page.setViewportSize({ width: viewports.desktop.width, height: viewports.desktop.height })
  }
  // A forged form (no CSRF token) changes nothing.
  const forged = await page.request.post(link, { form: { decision: 'approve' } })
  assert.equal(forged.status(), 403)

  await page.getByRole('button', { name: 'Approve' }).click()
  await page.getByText(/^Approved\. The agent may now act for you/).waitFor()
  assert.equal(await page.textContent('#status'), 'active')
  assert.equal(await page.getByRole('button', { name: 'Approve' }).count(), 0, 'no form once decided')
  await shot(page, 'consent-2-approved')
  await page.close()

  // openid-client polls (slow_down is handled inside) and validates the
  // ID token: signature, iss, aud, exp, sub.
  const tokens = await client.pollBackchannelAuthenticationGrant(config, asked)
  assert.equal(tokens.token_type.toLowerCase(), 'bearer')
  assert.equal(tokens.scope, 'openid email users:read')
  const claims = tokens.claims()
  assert.equal(claims.sub, env.PERSON_ID)
  assert.equal(claims.email, env.EMAIL)
  assert.deepEqual([claims.aud].flat(), [env.AGENT_ID])
  // Once only (CIBA Core §11: invalid_grant).
  assert.deepEqual(await pollOnce(asked.auth_req_id), { error: 'invalid_grant', status: 400 })

  const intro = await oauth.processIntrospectionResponse(as, agent,
    await oauth.introspectionRequest(as, agent, agentAuth, tokens.access_token, insecure))
  assert.equal(intro.active, true)
  assert.equal(intro.sub, env.PERSON_ID)
  assert.deepEqual(intro.act, { sub: env.AGENT_ID })

  // The access token is short (the server's lifetime); the refresh token
  // renews it (RFC 6749 §6), with openid-client, which validates the new
  // ID token, then with oauth4webapi; each rotates the refresh token.
  assert.ok(tokens.expires_in <= 3600)
  assert.equal(typeof tokens.refresh_token, 'string')
  const refreshed = await client.refreshTokenGrant(config, tokens.refresh_token)
  assert.notEqual(refreshed.access_token, tokens.access_token)
  assert.notEqual(refreshed.refresh_token, tokens.refresh_token)
  assert.equal(refreshed.scope, 'openid email users:read')
  assert.equal(refreshed.claims().sub, env.PERSON_ID)
  const again = await oauth.processRefreshTokenResponse(as, agent,
    await oauth.refreshTokenGrantRequest(as, agent, agentAuth, refreshed.refresh_token, insecure))
  assert.equal(typeof again.refresh_token, 'string')
  const introAgain = await oauth.processIntrospectionResponse(as, agent,
    await oauth.introspectionRequest(as, agent, agentAuth, again.access_token, insecure))
  assert.equal(introAgain.active, true)
  assert.equal(introAgain.sub, env.PERSON_ID)
  assert.deepEqual(introAgain.act, { sub: env.AGENT_ID })
  assert.ok(introAgain.exp <= intro.exp + 7 * 24 * 3600)
  // A rotated refresh token is refused (invalid_grant).
  await assert.rejects(
    oauth.processRefreshTokenResponse(as, agent, await oauth.refreshTokenGrantRequest(as, agent, agentAuth, tokens.refresh_token, insecure)),
    (e) => e instanceof oauth.ResponseBodyError && e.error === 'invalid_grant')
})

test('the person denies: access_denied', async () => {
  const asked = await client.initiateBackchannelAuthentication(config, { scope: 'openid', login_hint: env.PERSON_ID, binding_message: 'D3NY' })
  const page = await context.newPage() // signed in already
  await page.goto(await mailedLink(1))
  await page.getByRole('button', { name: 'Deny' }).click()
  await page.getByText('Denied. The agent has been told.').waitFor()
  assert.equal(await page.textContent('#status'), 'denied')
  await shot(page, 'consent-3-denied')
  await page.close()
  assert.deepEqual(await pollOnce(asked.auth_req_id), { error: 'access_denied', status: 400 })
})

test('the person approves for less time than the agent asked', async () => {
  const asked = await client.initiateBackchannelAuthentication(config, {
    scope: 'openid', login_hint: env.EMAIL, binding_message: 'SH0RT', delegation_expires_in: '604800',
  })
  const page = await context.newPage() // signed in already
  await page.goto(await mailedLink(2))
  const choice = page.getByLabel('Approve for')
  assert.equal(await choice.inputValue(), '604800', 'what the agent asked is chosen until the person changes it')
  assert.deepEqual(await choice.locator('option').allTextContents(), ['7 days (as asked)', '1 day', '1 hour', '15 minutes'])
  assert.equal(await choice.getAttribute('aria-describedby'), 'lifetime-hint')
  await choice.selectOption('86400')
  await shot(page, 'consent-4-shorter')
  await page.getByRole('button', { name: 'Approve' }).click()
  await page.getByText(/^Approved\. The agent may now act for you/).waitFor()
  assert.match(await page.textContent('#lifetime'), /^1 day after you approve/)
  const until = new Date(await page.getAttribute('#time-left', 'datetime'))
  const day = 24 * 3600 * 1000
  assert.ok(Math.abs(until - Date.now() - day) < 60000, `ends ${until.toISOString()}, a day from now`)
  await page.close()
  const tokens = await client.pollBackchannelAuthenticationGrant(config, asked)
  assert.equal(tokens.scope, 'openid')
  assert.equal(tokens.claims().sub, env.PERSON_ID)
  assert.equal(typeof tokens.refresh_token, 'string', 'a day outlives the access token')
})

test('nobody decides in time: expired_token', async () => {
  const asked = await client.initiateBackchannelAuthentication(config, { scope: 'openid', login_hint: env.EMAIL, requested_expiry: '1' })
  assert.equal(asked.expires_in, 1)
  await new Promise((ok) => setTimeout(ok, 1500))
  assert.deepEqual(await pollOnce(asked.auth_req_id), { error: 'expired_token', status: 400 })
})

test('the backchannel endpoint refuses what CIBA Core §13 lists', async () => {
  const refused = async (params) => {
    const res = await oauth.backchannelAuthenticationRequest(as, agent, agentAuth, params, insecure)
    try {
      await oauth.processBackchannelAuthenticationResponse(as, agent, res)
    } catch (e) {
      if (e instanceof oauth.ResponseBodyError) return e.error
      throw e
    }
    assert.fail('accepted')
  }
  assert.equal(await refused({ scope: 'openid users:write', login_hint: env.EMAIL }), 'invalid_scope')
  assert.equal(await refused({ scope: 'openid', login_hint: 'nobody@example.com' }), 'unknown_user_id')
  assert.equal(await refused({ scope: 'openid', login_hint: env.EMAIL, binding_message: 'x'.repeat(101) }), 'invalid_binding_message')
  assert.equal(await refused({ scope: 'openid', login_hint: env.EMAIL, user_code: '1234' }), 'invalid_request')
  assert.equal(await refused({ scope: 'openid' }), 'invalid_request')
  assert.equal((await pollOnce('x'.repeat(43))).error, 'invalid_grant')
  await context.close()
})
