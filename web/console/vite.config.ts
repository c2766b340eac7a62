// Builds the console into internal/console/dist/app, which the moat binary
// embeds (internal/console/assets.go). Nothing is loaded from a CDN: every
// script, style and font is bundled from node_modules.
import { defineConfig } from 'vite'

export default defineConfig({
  base: '/console/',
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  build: {
    outDir: '../../internal/console/dist/app',
    emptyOutDir: true,
    target: 'es2022',
    sourcemap: false,
    // One file per bundle, no inline <script>: the CSP allows only 'self'.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    reportCompressedSize: false,
  },
})
