// The HITL approval page, driven in Debian's Chromium by playwright-core:
// run by the Go e2e harness (TestHITLApprovalPageBrowser), which starts
// identityd and an SMTP server, registers the application, the people and
// the agent, makes two requests, and serves the links identityd e-mailed
// at MAILBOX (GET ?to=ADDRESS&after=N answers the link of the message
// after the first N to ADDRESS).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { accessible, chromiumSuite, shot, viewports } from './browser.mjs'
import { createHash, randomBytes } from 'node:crypto'

const env = process.env
const ISSUER = env.IDENTITYD_ISSUER
const chromiumBrowser = chromiumSuite()

function authorization() {
  const verifier = randomBytes(32).toString('base64url')
  const url = new URL(`${ISSUER}/api/v1/oauth/authorize`)
  const params = {
    client_id: env.CLIENT_ID, redirect_uri: env.REDIRECT_URI, response_type: 'code', scope: 'openid email',
    state: randomBytes(16).toString('base64url'), nonce: randomBytes(16).toString('base64url'),
    code_challenge: createHash('sha256').update(verifier).digest('base64url'), code_challenge_method: 'S256',
  }
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v)
  return url.toString()
}

async function mailedLink(to, n) {
  const deadline = Date.now() + 15000
  for (;;) {
    const r = await fetch(`${env.MAILBOX}?to=${encodeURIComponent(to)}&after=${n}`)
    if (r.status === 200) return (await r.json()).link
    if (Date.now() > deadline) throw new Error(`no approval e-mail to ${to}`)
    await new Promise((ok) => setTimeout(ok, 100))
  }
}

// Sign in with the password on the hosted pages: the browser then holds
// the SSO session the approval page reads.
async function signIn(context, email) {
  const page = await context.newPage()
  await page.goto(authorization())
  await page.getByLabel('Email').fill(email)
  await page.getByRole('button', { name: 'Continue' }).click()
  await page.getByLabel('Password').fill(env.PASSWORD)
  await page.getByRole('button', { name: 'Sign in' }).click()
  await page.waitForURL((u) => u.toString().startsWith(env.REDIRECT_URI))
  await page.close()
}

function checkHeaders(response) {
  const csp = response.headers()['content-security-policy']
  assert.match(csp, /default-src 'none'.*form-action 'self'.*frame-ancestors 'none'/)
  assert.equal(response.headers()['cache-control'], 'no-store')
  assert.equal(response.headers()['x-frame-options'], 'DENY')
}

test('the e-mailed links lead to the requests', async () => {
  const first = await mailedLink(env.EMAIL_APPROVER, 0)
  const second = await mailedLink(env.EMAIL_APPROVER, 1)
  assert.deepEqual(new Set([first, second]), new Set([`${ISSUER}/approvals/${env.APPROVE_ID}`, `${ISSUER}/approvals/${env.DENY_ID}`]))
})

test('without a session: the link leads through the sign-in and back', async () => {
  const context = await chromiumBrowser().newContext()
  const page = await context.newPage()
  const link = `${ISSUER}/approvals/${env.APPROVE_ID}`
  await page.goto(link)
  // identityd's own application signs the person in on the hosted page.
  assert.ok(page.url().startsWith(`${ISSUER}/signin`), page.url())
  assert.equal(await page.getByRole('button', { name: 'Approve' }).count(), 0)
  await page.getByLabel('Email').fill(env.EMAIL_APPROVER)
  await page.getByRole('button', { name: 'Continue' }).click()
  await page.getByLabel('Password').fill(env.PASSWORD)
  await page.getByRole('button', { name: 'Sign in' }).click()
  await page.waitForURL(link)
  assert.equal(await page.textContent('#agent-name'), env.AGENT_NAME)
  assert.equal(await page.getByRole('button', { name: 'Approve' }).count(), 1)
  await context.close()
})

test('a person who is not the approver sees nothing of it', async () => {
  const context = await chromiumBrowser().newContext()
  await signIn(context, env.EMAIL_OTHER)
  const page = await context.newPage()
  const response = await page.goto(`${ISSUER}/approvals/${env.APPROVE_ID}`)
  assert.equal(response.status(), 403)
  assert.match(await page.textContent('main'), /not an approver/)
  assert.doesNotMatch(await page.textContent('main'), /delete_user/)
  await context.close()
})

test('the approver approves one request and denies another', async () => {
  const context = await chromiumBrowser().newContext()
  await signIn(context, env.EMAIL_APPROVER)
  const page = await context.newPage()
  const link = await mailedLink(env.EMAIL_APPROVER, 0)
  const approveLink = link.endsWith(env.APPROVE_ID) ? link : `${ISSUER}/approvals/${env.APPROVE_ID}`
  const response = await page.goto(approveLink)
  assert.equal(response.status(), 200)
  checkHeaders(response)
  assert.equal(await page.textContent('#agent-name'), env.AGENT_NAME)
  assert.match(await page.textContent('main'), /autonomous, trust level sandboxed/)
  assert.equal(await page.textContent('#action'), 'update_user')
  assert.equal(await page.textContent('#resource'), 'users/1')
  // The call itself: what the approval lets through, once.
  assert.equal(await page.textContent('#call-method'), 'PATCH')
  assert.equal(await page.textContent('#call-path'), '/api/v1/m2m/users/1')
  assert.equal(await page.textContent('#call-body'),
    '{\n  "email": "ann@example.com",\n  "metadata": {\n    "level": 2,\n    "team": "ops"\n  },\n  "name": "Ann Lee"\n}')
  // The agent's words are text, never markup; a bidi override shows as
  // itself (<U+202E>), never reorders what follows.
  const words = await page.textContent('#context')
  assert.match(words, /<script>alert\(1\)<\/script> & <b>cleanup<\/b>/)
  assert.match(words, /"ticket": "OPS-<U\+202E>24"/)
  assert.ok(!/[\u202a-\u202e\u2066-\u2069\u200b]/.test(await page.textContent('main')), 'a format character reached the page')
  assert.equal(await page.locator('#context b, script').count(), 0)
  assert.match(await page.textContent('#time-left'), /^\d+ min \d\d s$/)
  assert.equal(await page.textContent('#status'), 'pending_approval')
  await accessible(page, 'the approval page')
  await shot(page, 'approval-1-pending')
  if (env.SCREENS_DIR) { // the same page on a phone, and both in dark
    await page.setViewportSize({ width: viewports.phone.width, height: viewports.phone.height })
    await shot(page, 'approval-phone-1-pending')
    await page.emulateMedia({ colorScheme: 'dark' })
    await shot(page, 'approval-dark-phone-1-pending')
    await page.setViewportSize({ width: viewports.desktop.width, height: viewports.desktop.height })
    await shot(page, 'approval-dark-1-pending')
    await page.emulateMedia({ colorScheme: 'light' })
  }

  // A forged form (no CSRF token) changes nothing.
  const forged = await page.request.post(approveLink, { form: { decision: 'approve', reason: 'forged' } })
  assert.equal(forged.status(), 403)

  await page.getByLabel('Reason').fill('checked the ticket')
  await page.getByRole('button', { name: 'Approve' }).click()
  await page.getByText('Approved. The agent may go ahead.').waitFor()
  assert.equal(await page.textContent('#status'), 'approved')
  assert.equal(await page.getByRole('button', { name: 'Approve' }).count(), 0, 'no form once decided')
  await shot(page, 'approval-2-approved')

  // Deny asks for a reason.
  await page.goto(`${ISSUER}/approvals/${env.DENY_ID}`)
  await page.getByRole('button', { name: 'Deny' }).click()
  await page.getByRole('alert').waitFor()
  assert.match(await page.getByRole('alert').textContent(), /Reason: is required/)
  assert.equal(await page.getByLabel('Reason').getAttribute('aria-invalid'), 'true')
  assert.equal(await page.textContent('#call-body-none'), 'No body.')
  await accessible(page, 'the approval page with a refused reason')
  await page.getByLabel('Reason').fill('not during the freeze')
  await page.getByRole('button', { name: 'Deny' }).click()
  await page.getByText('Denied. The agent has been told.').waitFor()
  assert.equal(await page.textContent('#status'), 'denied')
  await shot(page, 'approval-3-denied')
  await context.close()
})
