import { defineConfig } from 'vitest/config';
import { svelte } from '@sveltejs/vite-plugin-svelte';

// `npm run dev` proxies the API to a running `kiln up` (its `ui:` address), so the UI can be
// worked on with hot reload against a real instance.
const apiTarget = process.env.KILN_HTTP ?? 'http://127.0.0.1:7079';

export default defineConfig({
  plugins: [svelte()],
  server: { proxy: { '/api': { target: apiTarget, changeOrigin: false } } },
  build: { outDir: 'dist', sourcemap: true, chunkSizeWarningLimit: 800 },
  test: { include: ['src/**/*.test.ts'], environment: 'node' },
});
