// Sign-in through an upstream OpenID Connect provider (a second identityd)
// from the hosted page's "Continue with …" button, in Debian's Chromium by
// playwright-core, without JavaScript: run by the Go e2e harness
// (TestBrowserUpstream), which starts both servers and registers the
// application at the provider, the provider, the application and the
// person. With SCREENS_DIR set, the e-mail step with its button and the
// linking steps are photographed on a desktop and a phone viewport.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { chromiumSuite, shot, startsAt, viewports } from './browser.mjs'
import { createHash, randomBytes } from 'node:crypto'
import * as client from 'openid-client'

const env = process.env
const ISSUER = env.IDENTITYD_ISSUER // the server people sign in to
const UPSTREAM = env.UPSTREAM_ISSUER // the provider
const REDIRECT_URI = env.REDIRECT_URI

const chromiumBrowser = chromiumSuite()

function authorization() {
  const verifier = randomBytes(32).toString('base64url')
  const state = randomBytes(16).toString('base64url')
  const nonce = randomBytes(16).toString('base64url')
  const url = new URL(`${ISSUER}/api/v1/oauth/authorize`)
  const params = {
    client_id: env.CLIENT_ID, redirect_uri: REDIRECT_URI, response_type: 'code', scope: 'openid email profile',
    state, nonce, code_challenge: createHash('sha256').update(verifier).digest('base64url'), code_challenge_method: 'S256',
  }
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v)
  return { url: url.toString(), state, verifier, nonce }
}

for (const [device, viewport] of Object.entries(viewports)) {
  test(`${device}: "Continue with Acme SSO", the provider's sign-in, back with a code (no JavaScript)`, async () => {
    const context = await chromiumBrowser().newContext({ viewport: { width: viewport.width, height: viewport.height }, ...viewport, javaScriptEnabled: false })
    const page = await context.newPage()
    const auth = authorization()
    const first = await page.goto(auth.url)
    // The provider's authorization endpoint is a form target of the page.
    assert.match(first.headers()['content-security-policy'], new RegExp(`form-action 'self'[^;]*${UPSTREAM.replace(/[.]/g, '\\.')}`))
    const button = page.getByRole('button', { name: 'Continue with Acme SSO' })
    await button.waitFor()
    assert.ok(!/<script/i.test(await page.content()), 'a script on the page')
    await shot(page, `${device}-12-continue-with-provider`)
    await button.click()
    // At the provider: its own hosted page.
    await page.waitForURL((u) => u.toString().startsWith(UPSTREAM))
    await page.getByLabel('Email').fill(env[`EMAIL_${device.toUpperCase()}`])
    await page.getByRole('button', { name: 'Continue' }).click()
    await page.getByLabel('Password').fill(env.PASSWORD)
    await page.getByRole('button', { name: 'Sign in' }).click()
    // Back through identityd's callback to the application.
    await page.waitForURL((u) => u.toString().startsWith(REDIRECT_URI))
    const answer = new URL(page.url())
    assert.equal(answer.searchParams.get('state'), auth.state)
    assert.equal(answer.searchParams.get('iss'), ISSUER)
    const config = await client.discovery(new URL(ISSUER), env.CLIENT_ID, undefined, client.None(), { execute: [client.allowInsecureRequests] })
    const tokens = await client.authorizationCodeGrant(config, answer, {
      pkceCodeVerifier: auth.verifier, expectedState: auth.state, expectedNonce: auth.nonce, idTokenExpected: true,
    })
    const claims = tokens.claims()
    assert.equal(claims.email, env[`EMAIL_${device.toUpperCase()}`])
    assert.deepEqual(claims.amr, ['fed'])
    await context.close()
  })
}

for (const [device, viewport] of Object.entries(viewports)) {
  test(`${device}: an account's address through the provider: the link offer, the account's password, signed in as the account (no JavaScript)`, async () => {
    const context = await chromiumBrowser().newContext({ viewport: { width: viewport.width, height: viewport.height }, ...viewport, javaScriptEnabled: false })
    const page = await context.newPage()
    const auth = authorization()
    await page.goto(auth.url)
    await page.getByRole('button', { name: 'Continue with Acme SSO' }).click()
    await page.waitForURL((u) => u.toString().startsWith(UPSTREAM))
    await page.getByLabel('Email').fill(env[`LINK_EMAIL_${device.toUpperCase()}`])
    await page.getByRole('button', { name: 'Continue' }).click()
    await page.getByLabel('Password').fill(env.PASSWORD)
    await page.getByRole('button', { name: 'Sign in' }).click()
    // Back at identityd: the account exists; nobody is signed in yet.
    const offer = page.getByRole('button', { name: 'Link to my account' })
    await offer.waitFor()
    assert.match(await page.content(), /its password/)
    await shot(page, `${device}-13-link-offer`)
    await offer.click()
    // The proof: the account's password, by keyboard; a wrong one is said
    // next to the field.
    await startsAt(page, 'password')
    await page.keyboard.type('not the password')
    await page.keyboard.press('Enter')
    await page.getByRole('alert').waitFor()
    assert.equal(await page.getByLabel('Password').getAttribute('aria-invalid'), 'true')
    await page.getByLabel('Password').fill(env.ACCOUNT_PASSWORD)
    await shot(page, `${device}-14-link-password`)
    await page.getByRole('button', { name: 'Link and sign in' }).click()
    await page.waitForURL((u) => u.toString().startsWith(REDIRECT_URI))
    const answer = new URL(page.url())
    const config = await client.discovery(new URL(ISSUER), env.CLIENT_ID, undefined, client.None(), { execute: [client.allowInsecureRequests] })
    const tokens = await client.authorizationCodeGrant(config, answer, {
      pkceCodeVerifier: auth.verifier, expectedState: auth.state, expectedNonce: auth.nonce, idTokenExpected: true,
    })
    const claims = tokens.claims()
    assert.equal(claims.sub, env[`LINK_SUB_${device.toUpperCase()}`], 'signed in as the account')
    assert.deepEqual(claims.amr, ['fed'])
    await context.close()
  })
}
