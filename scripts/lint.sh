#!/usr/bin/env bash
# Style gates: checkpatch --strict over the exported kernel series (our code
# and the commit messages), clang-format over our userspace C and C++, groff
# warnings over the man pages, ours and those of the rdma-core series.
. "$(dirname "$0")/lib.sh"

rc=0
tree=$(cat "$OUT/.tree" 2>/dev/null || "$TOP/scripts/materialise.sh")
# Always this tree's series (a few seconds): one left by an earlier export
# would check old code.
ODPWATCH_SERIES_CHECK=1 "$TOP/scripts/export-series.sh"
series_names=$(kernel_series)
kernel_patches=()
for name in $series_names; do
	for p in "$OUT/series/$name"/0*.patch; do
		case $p in *0000-cover-letter.patch) ;; *) kernel_patches+=("$p") ;; esac
	done
done
for p in "${kernel_patches[@]}"; do
	# Selftests detect a kernel without the system call by its ENOSYS, the
	# one use of ENOSYS that checkpatch's warning about it allows.
	# The base is Debian's source imported as one commit: the upstream
	# commits that Fixes: tags name are not in it to look up.
	ignore=FILE_PATH_CHANGES,UNKNOWN_COMMIT_ID
	case $(basename "$p") in *-selftests-*) ignore=$ignore,ENOSYS ;; esac
	# Debian's python3 (with python3-ply) for spdxcheck.py, not one earlier on PATH.
	if ! out=$(PATH=/usr/bin:$PATH "$tree/scripts/checkpatch.pl" --strict --quiet --no-signoff --ignore "$ignore" \
		--root="$tree" "$p" 2>&1); then
		printf '%s\n%s\n' "checkpatch: $(basename "$p")" "$out" >&2
		rc=1
	fi
done
[ $rc = 0 ] && log "lint: checkpatch --strict clean on ${#kernel_patches[@]} patches ($(echo $series_names))"
# What a maintainer refuses on sight: a fix for the current release without
# Fixes: and Cc: stable, a new module parameter anywhere, an upstream file
# deleted (replaced wholesale instead of changed in place).
for p in "$OUT"/series/rdma-fixes/0*.patch; do
	case $p in *0000-cover-letter.patch) continue ;; esac
	grep -q '^Fixes: [0-9a-f]\{12\} ("' "$p" && grep -q '^Cc: stable@vger.kernel.org\( # .*\)\?$' "$p" || {
		echo "lint: $(basename "$p") of the fixes series lacks Fixes: or Cc: stable" >&2
		rc=1
	}
done
if grep -l '^+.*\bmodule_param' "${kernel_patches[@]}" >&2; then
	echo "lint: the patches above add a module parameter" >&2
	rc=1
fi
if grep -l '^deleted file mode' "${kernel_patches[@]}" >&2; then
	echo "lint: the patches above delete an upstream file" >&2
	rc=1
fi

mapfile -t files < <(cd "$TOP" && git ls-files 'libprovider/*.cpp' 'libprovider/*.hpp' 'libprovider/*.c' 'libprovider/*.h' 'bench/*.cpp' 'bench/*.hpp' \
	'middleware/*.cpp' 2>/dev/null)
if [ ${#files[@]} -gt 0 ]; then
	if (cd "$TOP" && clang-format --dry-run --Werror "${files[@]}" 2>&1 | head -40 >&2; exit "${PIPESTATUS[0]}"); then
		log "lint: clang-format clean on ${#files[@]} files"
	else
		log "lint: clang-format wants changes (clang-format -i on the files above)"
		rc=1
	fi
fi

# Man pages: groff with all warnings, as man(1) would format them.
mapfile -t pages < <(cd "$TOP" && git ls-files 'man/man*/*.[0-9]')
if [ ${#pages[@]} -gt 0 ]; then
	if out=$(cd "$TOP" && LC_ALL=C.UTF-8 groff -man -ww -z "${pages[@]}" 2>&1) && [ -z "$out" ]; then
		log "lint: groff -ww clean on ${#pages[@]} man pages"
	else
		printf '%s\n' "$out" >&2
		log "lint: groff warns about the man pages above"
		rc=1
	fi
fi
# Our kernel documentation pages: no docutils warning (they use no Sphinx
# roles or directives, so this is what the kernel's htmldocs would say;
# Debian's python3, the one python3-docutils is installed for).
mapfile -t rst < <(cd "$TOP" && git ls-files 'Documentation/*.rst')
if out=$(cd "$TOP" && /usr/bin/python3 "$TOP/scripts/check-rst.py" "${rst[@]}" 2>&1); then
	log "lint: $out"
else
	printf '%s\n' "$out" >&2
	log "lint: the documentation pages above have warnings"
	rc=1
fi
# memwatch_create(2)'s ERRORS against the errnos of mm/memwatch.c and of the
# bad-input selftest.
if out=$(python3 "$TOP/scripts/check-man-errnos.py" "$TOP"); then
	log "lint: $out"
else
	printf '%s\n' "$out" >&2
	log "lint: memwatch_create.2's ERRORS and the code disagree (above)"
	rc=1
fi
# The rdma-core series: it applies with git am, and its man pages are clean.
rc_src=$CACHE/rdma-core/lint
scratch_at_base "$("$TOP/other-projects/rdma-core/fetch.sh")" "$rc_src" lint
if git -C "$rc_src" -c user.name=lint -c user.email=lint@localhost am -q "$TOP"/other-projects/rdma-core/*.patch; then
	mapfile -t rc_pages < <(cd "$rc_src" && git diff --name-only --diff-filter=AM odpwatch-base HEAD -- '*.[0-9]')
	if out=$(cd "$rc_src" && LC_ALL=C.UTF-8 groff -man -ww -z "${rc_pages[@]}" 2>&1) && [ -z "$out" ]; then
		log "lint: rdma-core series applies; groff -ww clean on ${#rc_pages[@]} man pages it adds or changes"
	else
		printf '%s
' "$out" >&2
		log "lint: groff warns about the rdma-core series' man pages above"
		rc=1
	fi
else
	log "lint: the rdma-core series does not apply to rdma-core $RDMA_CORE_VERSION"
	rc=1
fi
exit $rc
