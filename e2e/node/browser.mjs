// What the browser suites (*.browser.mjs) share: Debian's Chromium driven
// by playwright-core, the application's callback page, the viewports the
// pages are looked at on, and screenshots (with SCREENS_DIR set).
import { before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createServer } from 'node:http'
import { mkdirSync, readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { chromium } from 'playwright-core'

const axeSource = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8')

const env = process.env
const SCREENS = env.SCREENS_DIR

export const viewports = {
  desktop: { width: 1280, height: 800 },
  phone: { width: 390, height: 844, isMobile: true, hasTouch: true, deviceScaleFactor: 2 },
}

// chromium launches Chromium (env CHROMIUM) before the suite's tests and
// serves the application's callback page on CALLBACK_PORT, both closed
// after them; it answers a function that gives the browser.
export function chromiumSuite() {
  let browser, callback
  before(async () => {
    browser = await chromium.launch({ executablePath: env.CHROMIUM, args: ['--no-sandbox'] })
    callback = createServer((req, res) => {
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
  return () => browser
}

// shot saves a full-page screenshot as SCREENS_DIR/name.png, if set.
export async function shot(page, name) {
  if (!SCREENS) return
  await page.screenshot({ path: join(SCREENS, `${name}.png`), fullPage: true })
}

// startsAt checks that the page's focus starts in #id: the element carries
// the page's one autofocus. The test then gives it the focus itself before
// typing: Chromium applies autofocus only on a rendering frame, and on a
// loaded machine a wait for that timed out once after 30 s.
export async function startsAt(page, id) {
  const field = page.locator(`#${id}`)
  await field.waitFor()
  assert.equal(await field.getAttribute('autofocus'), '')
  assert.equal(await page.locator('[autofocus]').count(), 1)
  await field.focus()
}

// focused waits until the page's script has put the focus on #id. It polls
// on a timer, not on animation frames, which a loaded machine holds back.
export async function focused(page, id) {
  await page.waitForFunction((id) => document.activeElement?.id === id, id, { polling: 100 })
}

// accessible checks the page with axe-core against WCAG 2.1 A and AA
// (text contrast 4.5:1 among them) in each color scheme, light and dark
// (prefers-color-scheme emulated), and leaves the page in light. axe runs
// through the DevTools protocol, which the pages' CSP does not govern.
export async function accessible(page, label) {
  for (const colorScheme of ['light', 'dark']) {
    await page.emulateMedia({ colorScheme })
    await page.evaluate(axeSource)
    const result = await page.evaluate(() => window.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } }))
    const problems = result.violations.map((v) => `${v.id}: ${v.nodes.map((n) => `${n.target.join(' ')} (${n.any.map((c) => c.message).join('; ')})`).join(', ')}`)
    assert.deepEqual(problems, [], `${label} in ${colorScheme}: axe-core finds WCAG 2.1 AA violations`)
  }
  await page.emulateMedia({ colorScheme: 'light' })
}
