// Password reset on the hosted pages, driven in Debian's Chromium by
// playwright-core: run by the Go e2e harness (TestBrowserPasswordReset),
// which starts identityd and an SMTP server, registers the application and
// the people, and serves the links identityd e-mailed at MAILBOX (a small
// HTTP endpoint of the test: GET ?to=ADDRESS&after=N answers the link of
// the message after the first N to ADDRESS). With SCREENS_DIR set, every
// step is photographed on a desktop and a phone viewport.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { chromiumSuite, shot, startsAt, viewports } from './browser.mjs'
import { createHash, randomBytes } from 'node:crypto'

const env = process.env
const ISSUER = env.IDENTITYD_ISSUER
const REDIRECT_URI = env.REDIRECT_URI
const PASSWORD = env.PASSWORD
const NEW_PASSWORD = 'a brand new passphrase'

const chromiumBrowser = chromiumSuite()

function authorization() {
  const verifier = randomBytes(32).toString('base64url')
  const url = new URL(`${ISSUER}/api/v1/oauth/authorize`)
  const params = {
    client_id: env.CLIENT_ID, redirect_uri: REDIRECT_URI, response_type: 'code', scope: 'openid email',
    state: randomBytes(16).toString('base64url'), nonce: randomBytes(16).toString('base64url'),
    code_challenge: createHash('sha256').update(verifier).digest('base64url'), code_challenge_method: 'S256',
  }
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v)
  return url.toString()
}

// The pages' rules: no script, no inline style, nothing from elsewhere,
// every visible input labelled, the strict CSP.
async function checkPage(page, response) {
  const html = await page.content()
  assert.ok(!/<script/i.test(html), 'a script on the page')
  assert.ok(!/style=/i.test(html), 'inline style')
  assert.ok(!/https?:\/\/(?!127\.0\.0\.1)/.test(html.replace(/value="[^"]*"/g, '')), 'a reference to another origin')
  for (const input of await page.locator('input:not([type=hidden]):not([hidden])').all()) {
    const id = await input.getAttribute('id')
    assert.ok(id && (await page.locator(`label[for="${id}"]`).count()) === 1, `input ${id} without a label`)
  }
  if (response) {
    const csp = response.headers()['content-security-policy']
    assert.match(csp, /default-src 'none'.*form-action 'self'.*frame-ancestors 'none'/)
    assert.equal(response.headers()['referrer-policy'], 'no-referrer')
    assert.equal(response.headers()['cache-control'], 'no-store')
  }
}

// The reset link identityd e-mailed to `to` after the first `n` messages.
async function mailedLink(to, n) {
  const deadline = Date.now() + 15000
  for (;;) {
    const r = await fetch(`${env.MAILBOX}?to=${encodeURIComponent(to)}&after=${n}`)
    if (r.status === 200) return (await r.json()).link
    if (Date.now() > deadline) throw new Error(`no reset e-mail to ${to}`)
    await new Promise((ok) => setTimeout(ok, 100))
  }
}

// Sign in with the password; lands back at the application.
async function signIn(context, email, password) {
  const page = await context.newPage()
  await page.goto(authorization())
  await page.getByLabel('Email').fill(email)
  await page.getByRole('button', { name: 'Continue' }).click()
  await page.getByLabel('Password').fill(password)
  await page.getByRole('button', { name: 'Sign in' }).click()
  await page.waitForURL((u) => u.toString().startsWith(REDIRECT_URI))
  assert.ok(new URL(page.url()).searchParams.get('code'), 'no code')
  await page.close()
}

for (const [device, viewport] of Object.entries(viewports)) {
  test(`${device}: "Forgot password?", the e-mailed link, a new password, signed in with it`, async () => {
    const email = device === 'phone' ? env.EMAIL_PHONE : env.EMAIL_DESKTOP
    const context = await chromiumBrowser().newContext({ viewport: { width: viewport.width, height: viewport.height }, ...viewport })
    const page = await context.newPage()
    await page.goto(authorization())
    await page.getByLabel('Email').fill(email)
    await page.getByRole('button', { name: 'Continue' }).click()
    await page.getByLabel('Password').waitFor()
    await shot(page, `reset-${device}-1-password-step`)

    const [forgot] = await Promise.all([page.waitForNavigation(), page.getByRole('link', { name: 'Forgot password?' }).click()])
    await checkPage(page, forgot)
    assert.equal(await page.getByLabel('Email').inputValue(), email, 'the address is filled in')
    assert.match(await page.textContent('.app'), /Acme Notes/)
    await shot(page, `reset-${device}-2-forgot`)
    await page.getByRole('button', { name: 'Email me a reset link' }).click()
    await page.getByText('If an account uses this e-mail address').waitFor()
    await checkPage(page)
    assert.ok(await page.getByRole('link', { name: 'Back to sign-in' }).isVisible())
    await shot(page, `reset-${device}-3-sent`)

    // The link, opened from the mail (another browser context).
    const link = await mailedLink(email, 0)
    const mailApp = await chromiumBrowser().newContext({ viewport: { width: viewport.width, height: viewport.height }, ...viewport })
    const reset = await mailApp.newPage()
    const opened = await reset.goto(link)
    await checkPage(reset, opened)
    assert.match(await reset.textContent('.app'), /Acme Notes/)
    assert.match(await reset.textContent('main'), new RegExp(`${email[0]}\\*\\*\\*@example\\.com`))
    assert.equal(await reset.getByLabel('New password', { exact: true }).getAttribute('autocomplete'), 'new-password')
    await shot(reset, `reset-${device}-4-choose`)
    await reset.getByLabel('New password', { exact: true }).fill(NEW_PASSWORD)
    await reset.getByLabel('Confirm new password').fill('something else entirely')
    await reset.getByRole('button', { name: 'Change password' }).click()
    await reset.getByRole('alert').waitFor()
    assert.match(await reset.getByRole('alert').textContent(), /not the same/)
    assert.equal(await reset.getByLabel('Confirm new password').getAttribute('aria-invalid'), 'true')
    await shot(reset, `reset-${device}-5-mismatch`)
    await reset.getByLabel('New password', { exact: true }).fill(NEW_PASSWORD)
    await reset.getByLabel('Confirm new password').fill(NEW_PASSWORD)
    await reset.getByRole('button', { name: 'Change password' }).click()
    await reset.getByRole('heading', { name: 'Password changed' }).waitFor()
    await shot(reset, `reset-${device}-6-changed`)

    // The link works once.
    const again = await reset.goto(link)
    assert.equal(again.status(), 400)
    assert.match(await reset.textContent('main'), /already used/)
    await mailApp.close()
    await context.close()
    await signIn(await chromiumBrowser().newContext(), email, NEW_PASSWORD)
  })
}

test('a refused password is said next to the field, and the link then has fewer attempts', async () => {
  const context = await chromiumBrowser().newContext()
  const page = await context.newPage()
  await page.goto(`${ISSUER}/signin/forgot-password?client_id=${env.CLIENT_ID}`)
  await page.getByLabel('Email').fill(env.EMAIL_WEAK)
  await page.getByRole('button', { name: 'Email me a reset link' }).click()
  await page.getByText('If an account uses this e-mail address').waitFor()
  await page.goto(await mailedLink(env.EMAIL_WEAK, 0))
  for (const pw of ['password123', env.EMAIL_WEAK]) {
    await page.getByLabel('New password', { exact: true }).fill(pw)
    await page.getByLabel('Confirm new password').fill(pw)
    await page.getByRole('button', { name: 'Change password' }).click()
    await page.getByRole('alert').waitFor()
  }
  assert.match(await page.getByRole('alert').textContent(), /e-mail address.*One attempt is left/s)
  await shot(page, 'reset-desktop-7-weak-password')
  await page.getByLabel('New password', { exact: true }).fill(NEW_PASSWORD)
  await page.getByLabel('Confirm new password').fill(NEW_PASSWORD)
  await page.getByRole('button', { name: 'Change password' }).click()
  await page.getByRole('heading', { name: 'Password changed' }).waitFor()
  await context.close()
})

test('keyboard only: focus starts in the field, Tab moves, Enter submits', async () => {
  const context = await chromiumBrowser().newContext()
  const page = await context.newPage()
  await page.goto(`${ISSUER}/signin/forgot-password?client_id=${env.CLIENT_ID}`)
  await startsAt(page, 'email')
  await page.keyboard.type(env.EMAIL_KEYS)
  await page.keyboard.press('Enter')
  await page.getByText('If an account uses this e-mail address').waitFor()
  await page.goto(await mailedLink(env.EMAIL_KEYS, 0))
  await startsAt(page, 'new-password')
  await page.keyboard.type(NEW_PASSWORD)
  await page.keyboard.press('Tab')
  assert.equal(await page.evaluate(() => document.activeElement.id), 'confirm-password')
  await page.keyboard.type(NEW_PASSWORD)
  await page.keyboard.press('Enter')
  await page.getByRole('heading', { name: 'Password changed' }).waitFor()
  await context.close()
  await signIn(await chromiumBrowser().newContext(), env.EMAIL_KEYS, NEW_PASSWORD)
})

test('without JavaScript: the whole reset works', async () => {
  const context = await chromiumBrowser().newContext({ javaScriptEnabled: false })
  const page = await context.newPage()
  await page.goto(authorization())
  await page.getByLabel('Email').fill(env.EMAIL_NOJS)
  await page.getByRole('button', { name: 'Continue' }).click()
  await page.getByRole('link', { name: 'Forgot password?' }).click()
  await page.getByRole('button', { name: 'Email me a reset link' }).click()
  await page.getByText('If an account uses this e-mail address').waitFor()
  await page.goto(await mailedLink(env.EMAIL_NOJS, 0))
  await page.getByLabel('New password', { exact: true }).fill(NEW_PASSWORD)
  await page.getByLabel('Confirm new password').fill(NEW_PASSWORD)
  await page.getByRole('button', { name: 'Change password' }).click()
  await page.getByRole('heading', { name: 'Password changed' }).waitFor()
  await context.close()
  await signIn(await chromiumBrowser().newContext({ javaScriptEnabled: false }), env.EMAIL_NOJS, NEW_PASSWORD)
})

test('an address without an account gets the same page, and a forged form is refused', async () => {
  const context = await chromiumBrowser().newContext()
  const page = await context.newPage()
  await page.goto(`${ISSUER}/signin/forgot-password?client_id=${env.CLIENT_ID}`)
  await page.getByLabel('Email').fill('nobody@example.com')
  await page.getByRole('button', { name: 'Email me a reset link' }).click()
  await page.getByText('If an account uses this e-mail address').waitFor()
  // A form posted without this browser's CSRF token.
  const forged = await context.request.post(`${ISSUER}/signin/forgot-password`, {
    form: { client_id: env.CLIENT_ID, email: env.EMAIL_DESKTOP, csrf_token: 'forged' },
  })
  assert.equal(forged.status(), 403)
  await context.close()
})
