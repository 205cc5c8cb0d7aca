#!/usr/bin/env bash
# Claude Code and Codex CLI, at the versions pinned in scripts/clients/package-lock.json, for
# tests/clients/ and the demo (README, "Claude Code, Codex and other agents"). Installed into
# .clients/ (git-ignored), never globally; idempotent, quick when done.
#
# Both npm packages ship their native binary in a per-platform optional dependency (nothing is
# downloaded outside npm). Claude Code's postinstall copies that binary over its bin/claude.exe
# placeholder; npm versions that hold back install scripts leave the placeholder, so the step is
# run here when the installed `claude` does not answer with its version.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq npm >/dev/null; }
stamp=.clients/.installed-$(cat scripts/clients/package.json scripts/clients/package-lock.json | sha1sum | cut -c1-12)
if [ ! -e "$stamp" ]; then
  rm -rf .clients
  mkdir -p .clients
  cp scripts/clients/package.json scripts/clients/package-lock.json .clients/
  npm ci --prefix .clients --no-audit --no-fund --loglevel=error
  if ! .clients/node_modules/.bin/claude --version >/dev/null 2>&1; then
    (cd .clients/node_modules/@anthropic-ai/claude-code && node install.cjs)
  fi
  touch "$stamp"
fi
want_claude=$(node -p 'require("./scripts/clients/package.json").dependencies["@anthropic-ai/claude-code"]')
want_codex=$(node -p 'require("./scripts/clients/package.json").dependencies["@openai/codex"]')
got_claude=$(.clients/node_modules/.bin/claude --version)
got_codex=$(.clients/node_modules/.bin/codex --version 2>/dev/null)
case "$got_claude" in "$want_claude "*) ;; *) echo "clients.sh: claude --version says '$got_claude', want $want_claude" >&2; exit 1 ;; esac
[ "$got_codex" = "codex-cli $want_codex" ] || { echo "clients.sh: codex --version says '$got_codex', want $want_codex" >&2; exit 1; }
