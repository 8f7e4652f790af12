// The hosted sign-in page driven in Debian's Chromium by playwright-core:
// run by the Go e2e harness (TestBrowserSignIn), which starts the servers,
// registers the applications and people, and passes them in the
// environment. With SCREENS_DIR set, every step is photographed on a
// desktop and a phone viewport.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createServer } from 'node:http'
import { createHash, randomBytes } from 'node:crypto'
import { mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { chromium } from 'playwright-core'
import * as client from 'openid-client'
import { startsAt } from './browser.mjs'

const env = process.env
const ISSUER = env.IDENTITYD_ISSUER
const REDIRECT_URI = env.REDIRECT_URI
const POST_LOGOUT_URI = env.POST_LOGOUT_URI
const PASSWORD = env.PASSWORD
const SCREENS = env.SCREENS_DIR

const viewports = {
  desktop: { width: 1280, height: 800 },
  phone: { width: 390, height: 844, isMobile: true, hasTouch: true, deviceScaleFactor: 2 },
}

let browser, callback
const landed = [] // the query of every request the application received

before(async () => {
  browser = await chromium.launch({ executablePath: env.CHROMIUM, args: ['--no-sandbox'] })
  // The application: it records what comes back and says so.
  callback = createServer((req, res) => {
    landed.push(new URL(req.url, REDIRECT_URI))
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' })
    res.end('<!doctype html><title>Acme</title><h1>Back at the application</h1>')
  })
  await new Promise((ok) => callback.listen(Number(env.CALLBACK_PORT), '127.0.0.1', ok))
  if (SCREENS) mkdirSync(SCREENS, { recursive: true })
})

after(async () => {
  await browser?.close()
  await new Promise((ok) => callback?.close(ok))
})

// An authorization request with PKCE, state and nonce.
function authorization(clientId = env.CLIENT_ID, issuer = ISSUER, extra = {}) {
  const verifier = randomBytes(32).toString('base64url')
  const state = randomBytes(16).toString('base64url')
  const nonce = randomBytes(16).toString('base64url')
  const url = new URL(`${issuer}/api/v1/oauth/authorize`)
  const params = {
    client_id: clientId, redirect_uri: REDIRECT_URI, response_type: 'code', scope: 'openid email profile',
    state, nonce,
    code_challenge: createHash('sha256').update(verifier).digest('base64url'), code_challenge_method: 'S256', ...extra,
  }
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v)
  return { url: url.toString(), state, verifier, nonce, clientId, issuer }
}

// The answer the application received: its state, the issuer (RFC 9207)
// and a code, which openid-client exchanges with the PKCE verifier (the
// applications are public: client_id only), checking the ID token's
// issuer, audience, nonce and expiry. Answers the ID token's claims.
async function expectCode(page, auth) {
  await page.waitForURL((u) => u.toString().startsWith(REDIRECT_URI))
  const answer = new URL(page.url())
  const q = answer.searchParams
  assert.equal(q.get('state'), auth.state)
  assert.ok(q.get('code'), `no code: ${page.url()}`)
  assert.equal(q.get('iss'), auth.issuer)
  const config = await client.discovery(new URL(auth.issuer), auth.clientId, undefined, client.None(), { execute: [client.allowInsecureRequests] })
  const tokens = await client.authorizationCodeGrant(config, answer, {
    pkceCodeVerifier: auth.verifier, expectedState: auth.state, expectedNonce: auth.nonce, idTokenExpected: true,
  })
  const claims = tokens.claims()
  assert.ok(claims.sub && tokens.access_token, 'no subject or access token')
  return claims
}

async function shot(page, name) {
  if (!SCREENS) return
  await page.screenshot({ path: join(SCREENS, `${name}.png`), fullPage: true })
}

// Every visible input has a label; the page names the application; no
// script, no inline style, nothing from elsewhere.
async function checkPage(page, appName = 'Acme Notes') {
  const html = await page.content()
  assert.ok(!/<script/i.test(html), 'a script on the page')
  assert.ok(!/style=/i.test(html), 'inline style')
  assert.ok(!/https?:\/\/(?!127\.0\.0\.1)/.test(html.replace(/value="[^"]*"/g, '')), 'a reference to another origin')
  if (appName) assert.match(await page.textContent('.app'), new RegExp(appName))
  for (const input of await page.locator('input:not([type=hidden]):not([hidden])').all()) {
    const id = await input.getAttribute('id')
    assert.ok(id && (await page.locator(`label[for="${id}"]`).count()) === 1, `input ${id} without a label`)
  }
}

// Sign in through the two steps; returns the password page's response.
async function signIn(page, email, password, name) {
  await checkPage(page)
  await page.getByLabel('Email').fill(email)
  if (name) await shot(page, `${name}-1-email`)
  await page.getByRole('button', { name: 'Continue' }).click()
  await page.getByLabel('Password').waitFor()
  await checkPage(page)
  await page.getByLabel('Password').fill(password)
  if (name) await shot(page, `${name}-2-password`)
  const [response] = await Promise.all([
    page.waitForResponse((r) => r.url().includes('/signin/password')),
    page.getByRole('button', { name: 'Sign in' }).click(),
  ])
  return response
}

for (const [device, viewport] of Object.entries(viewports)) {
  test(`${device}: e-mail, password, back to the application; then SSO without a page`, async () => {
    const context = await browser.newContext({ viewport: { width: viewport.width, height: viewport.height }, ...viewport })
    const page = await context.newPage()
    const auth = authorization()
    const first = await page.goto(auth.url)
    for (const h of ['content-security-policy', 'x-frame-options', 'referrer-policy', 'cache-control']) {
      assert.ok(first.headers()[h], `no ${h}`)
    }
    assert.match(first.headers()['content-security-policy'], /default-src 'none'.*frame-ancestors 'none'/)
    // One person per device: a second device's sign-in is a new device,
    // which the risk rules step up (that has its own tests).
    await signIn(page, device === 'phone' ? env.EMAIL_PHONE : env.EMAIL_ADA, PASSWORD, `${device}`)
    await expectCode(page, auth)
    await shot(page, `${device}-3-back-at-the-application`)
    // prompt=none, and another application: answered with no page.
    for (const clientId of [env.CLIENT_ID, env.OTHER_CLIENT_ID]) {
      const again = authorization(clientId, ISSUER, { prompt: 'none' })
      const seen = []
      page.on('request', (r) => seen.push(r.url()))
      await page.goto(again.url)
      await expectCode(page, again)
      assert.ok(!seen.some((u) => u.includes('/signin')), 'a page was shown for an SSO sign-in')
    }
    await context.close()
  })

  test(`${device}: the e-mailed methods' pages, reached from the password step`, async () => {
    const context = await browser.newContext({ viewport: { width: viewport.width, height: viewport.height }, ...viewport })
    const page = await context.newPage()
    await page.goto(authorization().url)
    await page.getByLabel('Email').fill(env.EMAIL_NOBODY)
    await page.getByRole('button', { name: 'Continue' }).click()
    await page.getByLabel('Password').waitFor()
    // The other methods are buttons beside the password form.
    await page.getByRole('button', { name: 'Email me a code' }).click()
    await page.getByLabel('Code').waitFor()
    await checkPage(page)
    assert.equal(await page.getByLabel('Code').getAttribute('autocomplete'), 'one-time-code')
    assert.match(await page.textContent('main'), /If .* can sign in with a code, we have sent one/)
    await shot(page, `${device}-10-email-code`)
    await page.getByRole('button', { name: 'Email me a link' }).click()
    await page.getByRole('button', { name: 'Send a new link' }).waitFor()
    await checkPage(page)
    assert.match(await page.textContent('main'), /Open it on this or another device/)
    await shot(page, `${device}-11-email-link`)
    await page.getByRole('button', { name: 'Sign in with a password' }).click()
    await page.getByLabel('Password').waitFor()
    await context.close()
  })

  test(`${device}: wrong password, then the error page of an unknown application`, async () => {
    const context = await browser.newContext({ viewport: { width: viewport.width, height: viewport.height }, ...viewport })
    const page = await context.newPage()
    await page.goto(authorization().url)
    const res = await signIn(page, env.EMAIL_ADA, 'not the password')
    assert.equal(res.status(), 401)
    const error = page.locator('#password-error')
    assert.match(await error.textContent(), /e-mail address or password is not right/)
    assert.equal(await page.getByLabel('Password').getAttribute('aria-describedby'), 'password-error')
    await shot(page, `${device}-4-wrong-password`)
    // An unknown e-mail reads exactly the same.
    await page.goto(authorization().url)
    await signIn(page, 'nobody@example.com', 'not the password')
    assert.match(await page.locator('#password-error').textContent(), /e-mail address or password is not right/)

    const unknown = await page.goto(authorization('app_unknown').url)
    assert.equal(unknown.status(), 401)
    assert.ok(page.url().startsWith(ISSUER), 'redirected for an unknown application')
    await checkPage(page, null)
    assert.match(await page.textContent('main'), /not registered/)
    await shot(page, `${device}-7-error-page`)
    await context.close()
  })
}

test('a disabled person cannot sign in', async () => {
  const page = await browser.newPage()
  await page.goto(authorization().url)
  const res = await signIn(page, env.EMAIL_OFF, PASSWORD)
  assert.equal(res.status(), 403)
  assert.match(await page.locator('#password-error').textContent(), /cannot sign in/)
  await shot(page, 'desktop-5-disabled')
  await page.close()
})

test('too many attempts: 429 with a clear message', async () => {
  for (const [device, viewport] of Object.entries(viewports)) {
    const context = await browser.newContext({ viewport: { width: viewport.width, height: viewport.height }, ...viewport })
    const page = await context.newPage()
    let res
    for (let i = 0; i < 6; i++) {
      await page.goto(authorization(env.LIMITED_CLIENT_ID, env.LIMITED_ISSUER).url)
      res = await signIn(page, env.EMAIL_TARGET, `wrong ${i}`)
      if (res.status() === 429) break
      assert.equal(res.status(), 401)
    }
    assert.equal(res.status(), 429)
    assert.ok(Number(res.headers()['retry-after']) > 0)
    assert.match(await page.textContent('main'), /Too many sign-in attempts/)
    await shot(page, `${device}-6-too-many-attempts`)
    await context.close()
  }
})

test('a form without its CSRF token, or with a wrong one, is refused', async () => {
  const context = await browser.newContext()
  const page = await context.newPage()
  await page.goto(authorization().url)
  await page.getByLabel('Email').fill(env.EMAIL_CSRF)
  // Missing: the hidden field removed.
  await page.locator('input[name=csrf_token]').evaluate((el) => el.remove())
  let [res] = await Promise.all([page.waitForResponse((r) => r.url().includes('/signin/email')), page.getByRole('button', { name: 'Continue' }).click()])
  assert.equal(res.status(), 403)
  assert.match(await page.textContent('main'), /not sent from this site/)
  await shot(page, 'desktop-8-csrf-refused')
  // Wrong: another value.
  await page.goBack()
  await page.reload()
  const flow = await page.locator('input[name=flow]').getAttribute('value')
  await page.locator('input[name=csrf_token]').evaluate((el) => { el.value = 'AAAA' })
  await page.getByLabel('Email').fill(env.EMAIL_CSRF)
  ;[res] = await Promise.all([page.waitForResponse((r) => r.url().includes('/signin/email')), page.getByRole('button', { name: 'Continue' }).click()])
  assert.equal(res.status(), 403)
  // And posted from outside the page, with the browser's cookies.
  const direct = await context.request.post(`${ISSUER}/signin/email`, { form: { flow, email: env.EMAIL_CSRF }, maxRedirects: 0 })
  assert.equal(direct.status(), 403)
  await context.close()
})

test('keyboard only: focus starts in the field, Enter submits', async () => {
  const page = await browser.newPage()
  const auth = authorization()
  await page.goto(auth.url)
  await startsAt(page, 'email')
  await page.keyboard.type(env.EMAIL_KEYS)
  await page.keyboard.press('Tab')
  assert.equal(await page.evaluate(() => document.activeElement?.textContent?.trim()), 'Continue')
  await page.keyboard.press('Enter')
  await startsAt(page, 'password')
  await page.keyboard.type(PASSWORD)
  await page.keyboard.press('Enter')
  await expectCode(page, auth)
  await page.close()
})

test('without JavaScript', async () => {
  const context = await browser.newContext({ javaScriptEnabled: false })
  const page = await context.newPage()
  const auth = authorization()
  await page.goto(auth.url)
  await signIn(page, env.EMAIL_NOJS, PASSWORD)
  await expectCode(page, auth)
  await context.close()
})

test('sign-out: asked, then back to the application with state', async () => {
  for (const [device, viewport] of Object.entries(viewports)) {
    const context = await browser.newContext({ viewport: { width: viewport.width, height: viewport.height }, ...viewport })
    const page = await context.newPage()
    const auth = authorization()
    await page.goto(auth.url)
    await signIn(page, device === 'phone' ? env.EMAIL_BYEPHONE : env.EMAIL_BYE, PASSWORD) // one person per device, as above
    await expectCode(page, auth)
    const url = new URL(`${ISSUER}/api/v1/oauth/logout`)
    url.searchParams.set('client_id', env.CLIENT_ID)
    url.searchParams.set('post_logout_redirect_uri', POST_LOGOUT_URI)
    url.searchParams.set('state', 'bye-state')
    await page.goto(url.toString())
    await checkPage(page)
    await shot(page, `${device}-9-sign-out`)
    await page.getByRole('button', { name: 'Sign out' }).click()
    await page.waitForURL((u) => u.toString().startsWith(POST_LOGOUT_URI))
    assert.equal(new URL(page.url()).searchParams.get('state'), 'bye-state')
    // The session is gone: prompt=none now answers login_required.
    const again = authorization(env.CLIENT_ID, ISSUER, { prompt: 'none' })
    await page.goto(again.url)
    await page.waitForURL((u) => u.toString().startsWith(REDIRECT_URI))
    assert.equal(new URL(page.url()).searchParams.get('error'), 'login_required')
    // An unregistered address: a page, no redirect.
    url.searchParams.set('post_logout_redirect_uri', 'https://evil.example/')
    const res = await page.goto(url.toString())
    assert.equal(res.status(), 400)
    assert.ok(page.url().startsWith(ISSUER))
    await context.close()
  }
})
