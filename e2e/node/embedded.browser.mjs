// The embedded sign-in API from an application's own page in Debian's
// Chromium, driven by playwright-core: run by the Go e2e harness
// (TestEmbeddedSignInBrowser), which starts identityd with SMTP to a server
// inside the test, registers the application (its webOrigins: APP_ORIGIN
// only) and the people, and runs the application servers: the page
// (embedded.page.mjs) at APP_ORIGIN, the same page at STRANGER_ORIGIN (an
// origin no application registered) and at NEIGHBOUR_ORIGIN (registered by
// another application). The e-mailed code and link are read through the
// application server's /last-code and /last-link, which the Go test answers
// from the messages its SMTP server received.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { chromium } from 'playwright-core'

const env = process.env
let browser

before(async () => {
  browser = await chromium.launch({ executablePath: env.CHROMIUM, args: ['--no-sandbox'] })
})

after(async () => {
  await browser?.close()
})

// open loads the application's page at origin in a fresh context.
async function open(origin, path = '/') {
  const context = await browser.newContext()
  const page = await context.newPage()
  await page.goto(origin + path)
  await page.waitForSelector('body[data-ready=true]')
  return { context, page }
}

// mailed reads what the last message to email carried (code or link),
// through the application server's test endpoint.
async function mailed(what, email) {
  const res = await fetch(`${env.APP_BACKEND}/last-${what}?email=${encodeURIComponent(email)}`)
  const text = await res.text()
  assert.equal(res.status, 200, `no ${what} for ${email}: ${text}`)
  return text.trim()
}

test('a code: check-email, otp/send, otp/verify with the page\'s PKCE, the backend\'s exchange', async () => {
  const { context, page } = await open(env.APP_ORIGIN)
  const challenge = await page.evaluate(() => app.begin())
  assert.match(challenge, /^[A-Za-z0-9_-]{43}$/)
  const check = await page.evaluate((e) => app.checkEmail(e), env.OTP_EMAIL)
  assert.equal(check.status, 200, JSON.stringify(check))
  assert.equal(check.body.exists, true)
  assert.deepEqual(check.body.methods, ['otp', 'magic-link'])
  const sent = await page.evaluate((e) => app.sendCode(e), env.OTP_EMAIL)
  assert.equal(sent.status, 200, JSON.stringify(sent))
  assert.equal(sent.body.success, true)
  const code = await mailed('code', env.OTP_EMAIL)
  assert.match(code, /^\d{6}$/)
  const result = await page.evaluate(([e, c]) => app.verifyCode(e, c), [env.OTP_EMAIL, code])
  assert.equal(result.verified?.status, 200, JSON.stringify(result))
  assert.equal(result.verified.body.expiresIn, 600)
  assert.equal(result.session?.status, 200, JSON.stringify(result))
  assert.equal(result.session.body.sub, env.OTP_USER_ID)
  assert.equal(result.session.body.email, env.OTP_EMAIL)
  // The same code again, with a new challenge: spent.
  await page.evaluate(() => app.begin())
  const again = await page.evaluate(([e, c]) => app.verifyCode(e, c), [env.OTP_EMAIL, code])
  assert.equal(again.verified?.status, 400, JSON.stringify(again))
  assert.equal(again.verified.body.error, 'expired_token')
  await context.close()
})

test('a person with a password: check-email says so, otp/send is 409 account_exists, the password signs in', async () => {
  const { context, page } = await open(env.APP_ORIGIN)
  await page.evaluate(() => app.begin())
  const check = await page.evaluate((e) => app.checkEmail(e), env.PW_EMAIL)
  assert.equal(check.status, 200, JSON.stringify(check))
  assert.deepEqual(check.body.methods, ['password'])
  const sent = await page.evaluate((e) => app.sendCode(e), env.PW_EMAIL)
  assert.equal(sent.status, 409, JSON.stringify(sent))
  assert.equal(sent.body.error, 'account_exists')
  assert.deepEqual(sent.body.existingIdentities, ['password'])
  assert.equal(sent.body.linkingRequired, true)
  assert.equal(sent.body.linkingEndpoint, '/api/v1/auth/link/initiate')
  const wrong = await page.evaluate(([e, p]) => app.password(e, p), [env.PW_EMAIL, 'not the password'])
  assert.equal(wrong.signedIn?.status, 401, JSON.stringify(wrong))
  assert.equal(wrong.signedIn.body.error, 'invalid_credentials')
  const result = await page.evaluate(([e, p]) => app.password(e, p), [env.PW_EMAIL, env.PASSWORD])
  assert.equal(result.session?.status, 200, JSON.stringify(result))
  assert.equal(result.session.body.sub, env.PW_USER_ID)
  assert.ok(result.session.body.amr.includes('pwd'), JSON.stringify(result.session.body))
  await context.close()
})

test('an origin no application registered: the preflight is refused and the fetch fails', async () => {
  const { context, page } = await open(env.STRANGER_ORIGIN)
  await page.evaluate(() => app.begin())
  for (const [name, call] of [['check-email', (e) => app.checkEmail(e)], ['otp/send', (e) => app.sendCode(e)]]) {
    const r = await page.evaluate(call, env.OTP_EMAIL)
    assert.equal(r.error, 'TypeError', `${name}: ${JSON.stringify(r)}`)
  }
  await context.close()
})

test('an origin another application registered: the call is refused and the fetch fails', async () => {
  const { context, page } = await open(env.NEIGHBOUR_ORIGIN)
  await page.evaluate(() => app.begin())
  const r = await page.evaluate((e) => app.checkEmail(e), env.OTP_EMAIL)
  assert.equal(r.error, 'TypeError', JSON.stringify(r))
  await context.close()
})

test('a magic link: asked from the page, opened from the e-mail, confirmed, exchanged at the callback', async () => {
  const { context, page } = await open(env.APP_ORIGIN)
  await page.evaluate(() => app.begin())
  const sent = await page.evaluate((e) => app.sendLink(e), env.OTP_EMAIL)
  assert.equal(sent.status, 200, JSON.stringify(sent))
  const link = await mailed('link', env.OTP_EMAIL)
  assert.ok(link.startsWith(`${env.IDENTITYD_ISSUER}/api/v1/embedded/auth/magic-link/verify?token=`), link)
  const confirm = await page.goto(link)
  assert.equal(confirm.status(), 200)
  assert.match(await page.textContent('main'), new RegExp(`Sign in as ${env.OTP_EMAIL.replace('.', '\\.')}`))
  await page.getByRole('button', { name: 'Sign in' }).click()
  await page.waitForURL((u) => u.toString().startsWith(`${env.APP_ORIGIN}/callback?`))
  const landed = new URL(page.url())
  assert.ok(landed.searchParams.get('code'))
  assert.equal(landed.searchParams.get('iss'), env.IDENTITYD_ISSUER)
  await page.waitForSelector('#result:not(:empty)')
  const result = JSON.parse(await page.textContent('#result'))
  assert.equal(result.status, 200, JSON.stringify(result))
  assert.equal(result.body.sub, env.OTP_USER_ID)
  assert.equal(result.iss, env.IDENTITYD_ISSUER)
  // The link is spent: opened again, it has expired.
  const again = await page.goto(link)
  assert.equal(again.status(), 400)
  assert.match(await page.textContent('main'), /expired/)
  await context.close()
})
