// Builds the console into internal/console/dist/app, which the moat binary
// embeds (internal/console/assets.go). Nothing is loaded from a CDN: every
// script, style and font is bundled from node_modules. Vite 6 is the last
// that runs on Debian 12's Node 18 (Vite 7 wants Node 20.19).
import { defineConfig } from 'vite'

export default defineConfig({
  base: '/console/',
  esbuild: { jsx: 'automatic', jsxImportSource: 'preact' },
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
