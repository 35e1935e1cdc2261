# Sourced by the launch scripts: token authentication on, and the cluster token located.
#   find_token SCRIPT HINT   RAY_AUTH_TOKEN if set; else the file RAY_AUTH_TOKEN_PATH (default
#                            ~/.ray/auth_token, Ray's own), exported; none: HINT on stderr, exit 2.
export RAY_AUTH_MODE=token

find_token() {
  if [ -n "${RAY_AUTH_TOKEN:-}" ]; then return 0; fi
  local path="${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"
  if [ ! -s "$path" ]; then
    echo "$1: no cluster token at $path: $2" >&2
    exit 2
  fi
  chmod 600 "$path" 2>/dev/null || true
  export RAY_AUTH_TOKEN_PATH="$path"
}
