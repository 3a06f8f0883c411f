//! What a release unmaps, how smaps is read, and that the process runs on after a release.

use crate::resident::*;

const EXE: &str = "/usr/local/bin/controller-manager";

fn mapping(perms: &str, path: &str, anonymous_kib: u64) -> Mapping {
    Mapping {
        start: 0x1000,
        end: 0x5000,
        perms: perms.into(),
        path: path.into(),
        anonymous_kib,
        rss_kib: 16,
    }
}

#[test]
fn only_private_read_only_file_pages_with_none_of_their_own() {
    // (perms, path, anonymous KiB, releasable)
    let cases = [
        ("r-xp", EXE, 0, true),
        ("r--p", EXE, 0, true),
        // Relocated read-only data (RELRO) and anything a debugger patched: pages of its own.
        ("r--p", EXE, 4, false),
        ("r-xp", EXE, 4, false),
        // Writable, shared, or not readable: never.
        ("rw-p", EXE, 0, false),
        ("r-xs", EXE, 0, false),
        ("r--s", EXE, 0, false),
        ("---p", EXE, 0, false),
        ("rwxp", EXE, 0, false),
        // Libraries alike; a replaced binary still maps its own (unlinked) file.
        ("r-xp", "/usr/lib/x86_64-linux-gnu/libc.so.6", 0, true),
        ("r--p", "/usr/lib/x86_64-linux-gnu/libc.so.6", 8, false),
        (
            "r-xp",
            "/usr/local/bin/controller-manager (deleted)",
            0,
            true,
        ),
        // The kernel's pages, the heap, the stack, anonymous mappings: not files.
        ("r-xp", "[vdso]", 0, false),
        ("r--p", "[vvar]", 0, false),
        ("r--p", "[heap]", 0, false),
        ("r--p", "", 0, false),
    ];
    for (perms, path, anon, want) in cases {
        assert_eq!(
            releasable(&mapping(perms, path, anon)),
            want,
            "{perms} {path:?} anonymous={anon}"
        );
    }
    let mut empty = mapping("r-xp", EXE, 0);
    empty.end = empty.start;
    assert!(!releasable(&empty), "an empty range is nothing to release");
}

#[test]
fn smaps_parsed_with_paths_holding_spaces_and_unknown_lines() {
    let text = "\
55cf5bfd7000-55cf5c39e000 r--p 00000000 fe:00 1234                       /usr/local/bin/controller-manager
Size:               3868 kB
Rss:                1508 kB
Anonymous:             0 kB
VmFlags: rd mr mw me dw sd
55cf5d130000-55cf5d1b1000 r--p 01d59000 fe:00 1234                       /opt/my tools/bin
Rss:                 516 kB
Anonymous:           516 kB
7ffd1000-7ffd3000 rw-p 00000000 00:00 0                                  [stack]
Rss:                   8 kB
garbage line
7f00-zz r--p 0 0 0 /bad
Rss: 99 kB
";
    let maps = parse_smaps(text);
    assert_eq!(maps.len(), 3, "{maps:?}");
    assert_eq!(maps[0].start, 0x55cf5bfd7000);
    assert_eq!(maps[0].end, 0x55cf5c39e000);
    assert_eq!(maps[0].path, EXE);
    assert_eq!((maps[0].rss_kib, maps[0].anonymous_kib), (1508, 0));
    assert_eq!(maps[1].path, "/opt/my tools/bin");
    assert_eq!(maps[1].anonymous_kib, 516);
    assert_eq!(maps[2].path, "[stack]");
    // The garbage line ended the stack's mapping, the malformed header too: the Rss after it
    // went to no one.
    assert_eq!(maps[2].rss_kib, 8);
}

/// Resident KiB of the test binary's mappings that a release would unmap.
fn releasable_resident_kib() -> u64 {
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let exe = exe.to_string_lossy();
    parse_smaps(&std::fs::read_to_string("/proc/self/smaps").unwrap())
        .iter()
        .filter(|m| m.path == exe && releasable(m))
        .map(|m| m.rss_kib)
        .sum()
}

#[test]
fn releasing_lowers_the_resident_code_and_the_process_runs_on() {
    let before = releasable_resident_kib();
    let released = release_unused_pages().expect("released");
    assert!(released.mappings >= 1, "{released:?}");
    assert!(released.resident_kib > 0, "{released:?}");
    let after = releasable_resident_kib();
    // The code unmapped is mapped back as it runs (this test's own, the allocator's, the
    // formatting machinery's), so not to zero; the test binary's 64 KiB fault-around of what
    // ran since, in one thread, is far under half of what start-up had mapped.
    assert!(
        after < before / 2,
        "the binary's read-only pages: {before} KiB resident before, {after} KiB after"
    );
    let s: String = (0..1000).map(|i| format!("{i},")).collect();
    assert!(s.starts_with("0,1,2,"));
    // Nothing of the process's own was in what was released: the data it relocated is intact
    // (a static table of references reads back as written).
    static NAMES: [&str; 3] = ["quarantine", "frontend", "allowlist"];
    assert_eq!(NAMES.concat(), "quarantinefrontendallowlist");
}
