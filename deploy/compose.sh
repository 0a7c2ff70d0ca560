#!/bin/sh
# Composes a hapwright config from a template library and a site file:
#
#   deploy/compose.sh LIBRARY SITE > hapwright.yaml
#
# The library (e.g. examples/kubernetes-ingress/hapwright.yaml) brings the templates;
# the site file brings what is yours: the values of the library's extraContext, extra
# `global-*`/`defaults-*` snippets, and the `haproxy` and `controller` sections. Both
# are YAML mappings written in block style with their keys at column 0.
#
# Top-level key by key, in the library's order: a key the site file has replaces the
# library's, except `templateSnippets`, where the site's snippets are added to the
# library's; the library's `validationTests` are left out (they test the library with
# its own settings: run them with `hapwright test -c <library>`). Then the site's
# other keys follow. A comment line directly above a key belongs to that key.
set -eu
if [ $# -ne 2 ]; then
    echo "usage: $0 LIBRARY SITE > hapwright.yaml" >&2
    exit 2
fi
for file in "$1" "$2"; do
    [ -r "$file" ] || { echo "$0: cannot read $file" >&2; exit 1; }
done
awk -v library="$1" -v site="$2" '
function key_of(line) {
    if (line ~ /^[A-Za-z_][A-Za-z0-9_]*:/) { sub(/:.*/, "", line); return line }
    return ""
}
# Reads `file` into blocks: text[file, key] (the key line, the lines under it and the
# comment lines directly above it), order[file, i], count[file]. Blank lines and
# comments above the first key are the header.
function read(file,    line, key, pending, n) {
    n = 0; key = ""; pending = ""
    while ((getline line < file) > 0) {
        k = key_of(line)
        if (k != "") {
            if ((file SUBSEP k) in text) {
                printf "%s: top-level key %s appears twice\n", file, k > "/dev/stderr"; exit 1
            }
            key = k; order[file, ++n] = k
            text[file, k] = pending line "\n"; pending = ""
        } else if (line ~ /^#/ || line ~ /^[ \t]*$/) {
            pending = pending line "\n"
        } else if (line ~ /^[ \t]/ && key != "") {
            text[file, key] = text[file, key] pending line "\n"; pending = ""
        } else {
            printf "%s: line not in block style at column 0: %s\n", file, line > "/dev/stderr"; exit 1
        }
    }
    close(file)
    if (key != "") text[file, key] = text[file, key] pending
    count[file] = n
}
# The lines under a block key, without the key line and the comments above it.
function body(block,    i, lines, n, out, started) {
    n = split(block, lines, "\n"); out = ""; started = 0
    for (i = 1; i <= n; i++) {
        if (started) out = out lines[i] (i < n ? "\n" : "")
        else if (key_of(lines[i]) != "") started = 1
    }
    return out
}
BEGIN {
    read(library); read(site)
    printf "# Composed by deploy/compose.sh from %s (the library) and %s\n", library, site
    printf "# (the site settings). Edit those, not this file.\n"
    for (i = 1; i <= count[library]; i++) {
        k = order[library, i]
        if (k == "validationTests") continue
        used[k] = 1
        if (!((site SUBSEP k) in text)) { printf "%s", text[library, k]; continue }
        if (k == "templateSnippets") {
            block = text[library, k]
            sub(/\n+$/, "\n", block)
            printf "%s%s\n", block, body(text[site, k])
        } else {
            printf "%s", text[site, k]
        }
    }
    for (i = 1; i <= count[site]; i++) {
        k = order[site, i]
        if (!(k in used)) printf "%s", text[site, k]
    }
}'
