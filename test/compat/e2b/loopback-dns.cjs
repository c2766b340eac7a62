// Preloaded (NODE_OPTIONS=--require) into the suite's node processes only:
// names under $MOAT_E2B_DOMAIN (api.<domain>, <port>-<id>.<domain>)
// resolve to $MOAT_E2B_ADDR, the loopback address test/e2e serves moat's
// TLS listener on. The SDK, unchanged, runs in its domain mode; nothing
// else on the host resolves these names.
'use strict'
const dns = require('node:dns')

const domain = (process.env.MOAT_E2B_DOMAIN || '').toLowerCase()
const addr = process.env.MOAT_E2B_ADDR
if (domain && addr) {
  const ours = host => {
    const h = String(host).toLowerCase().replace(/\.$/, '')
    return h === domain || h.endsWith('.' + domain)
  }
  const lookup = dns.lookup
  dns.lookup = function (host, options, callback) {
    return lookup.call(this, ours(host) ? addr : host, options, callback)
  }
  const plookup = dns.promises.lookup
  dns.promises.lookup = function (host, options) {
    return plookup.call(this, ours(host) ? addr : host, options)
  }
}
