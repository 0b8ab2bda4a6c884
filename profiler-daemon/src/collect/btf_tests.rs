use super::*;

/// A BTF blob: int; struct inner { int a; int b; }; struct outer { int x;
/// struct { struct inner in; }; } — the field sits in an anonymous struct.
fn blob() -> Vec<u8> {
    blob_with(0, 0, 0)
}

/// The blob, its names after a string of `padding` bytes (the string
/// section is read in windows, and a name may straddle two), `fillers` more
/// records after its types (a volatile, then ints: the type section is read
/// in windows too, and a record may straddle two), its type section said
/// `cut` bytes shorter than it is.
fn blob_with(padding: usize, fillers: usize, cut: u32) -> Vec<u8> {
    let mut strings = b"\0".to_vec();
    if padding > 0 {
        strings.extend(std::iter::repeat_n(b'p', padding - 1));
        strings.push(0);
    }
    strings.extend_from_slice(b"int\0inner\0a\0b\0outer\0x\0in\0");
    let name = |s: &str| {
        let needle = [s.as_bytes(), b"\0"].concat();
        strings
            .windows(needle.len())
            .position(|w| w == needle)
            .expect("name in table") as u32
    };
    let mut types = Vec::new();
    let mut push = |words: &[u32]| {
        words
            .iter()
            .for_each(|w| types.extend_from_slice(&w.to_le_bytes()))
    };
    push(&[name("int"), KIND_INT << 24, 4, 32]); // id 1
    push(&[name("inner"), (KIND_STRUCT << 24) | 2, 8]); // id 2
    push(&[name("a"), 1, 0]);
    push(&[name("b"), 1, 32]);
    push(&[0, (KIND_STRUCT << 24) | 1, 8]); // id 3: anonymous
    push(&[name("in"), 2, 0]);
    push(&[name("outer"), (KIND_STRUCT << 24) | 2, 16]); // id 4
    push(&[name("x"), 1, 0]);
    push(&[0, 3, 64]);
    if fillers > 0 {
        push(&[0, KIND_VOLATILE << 24, 1]); // 12 bytes: the ints after straddle
        for _ in 1..fillers {
            push(&[name("int"), KIND_INT << 24, 4, 32]);
        }
    }
    let mut data = Vec::new();
    for word in [
        u32::from(MAGIC) | (1 << 16),
        24,
        0,
        types.len() as u32 - cut,
        types.len() as u32,
    ] {
        data.extend_from_slice(&word.to_le_bytes());
    }
    data.extend_from_slice(&(strings.len() as u32).to_le_bytes());
    data.extend_from_slice(&types);
    data.extend_from_slice(&strings);
    data
}

#[test]
fn finds_members_through_anonymous_structs() {
    let blob = blob();
    let btf = Btf::index(&blob[..], "outer").expect("valid blob");
    assert_eq!(btf.member_offset(&["x"]), Ok(0));
    assert_eq!(btf.member_offset(&["in", "b"]), Ok(8 + 4));
    assert_eq!(
        btf.member_offset(&["in", "c"]),
        Err(BtfError::NoMember {
            ty: "outer.in".into(),
            member: "c".into()
        })
    );
    assert_eq!(
        Btf::index(&blob[..], "nope").err(),
        Some(BtfError::NoStruct("nope".into()))
    );
    // A member's name, not a struct's.
    let member = Btf::index(&blob[..], "in").expect("valid blob");
    assert_eq!(member.member_offset(&["x"]), Err(BtfError::NoStruct("in".into())));
}

#[test]
fn finds_a_name_wherever_it_falls_in_the_string_windows() {
    const WINDOW: usize = Window::<[u8]>::BYTES;
    // "outer" is 13 bytes after the padding: whole in the first window,
    // across its end at each of its bytes, and whole in the second.
    for padding in (WINDOW - 24)..(WINDOW - 4) {
        let blob = blob_with(padding, 0, 0);
        let btf = Btf::index(&blob[..], "outer").expect("valid blob");
        assert_eq!(btf.member_offset(&["in", "b"]), Ok(12), "padding {padding}");
    }
    // Whole strings only: "uter" ends one, and is none.
    let blob = blob();
    let btf = Btf::index(&blob[..], "outer").expect("valid blob");
    let strings = &blob[btf.strings_at as usize..];
    let outer = btf.string_offsets("outer").expect("strings");
    assert_eq!(outer.len(), 1);
    assert!(strings[outer[0] as usize..].starts_with(b"outer\0"));
    assert_eq!(btf.string_offsets("uter"), Ok(Vec::new()));
}

/// The type section read in windows: the struct is found, and the records
/// past it indexed, whatever straddles a window's end.
#[test]
fn indexes_a_type_section_longer_than_a_window() {
    const WINDOW: usize = Window::<[u8]>::BYTES;
    let fillers = WINDOW * 3 / 2 / 16;
    let blob = blob_with(0, fillers, 0);
    let btf = Btf::index(&blob[..], "outer").expect("valid blob");
    assert_eq!(
        btf.records.len(),
        1 + 4 + fillers,
        "void, the 4 types and the fillers"
    );
    assert_eq!(btf.member_offset(&["in", "b"]), Ok(12));
    // A section said to end inside its last record.
    assert_eq!(
        Btf::index(&blob_with(0, fillers, 4)[..], "outer").err(),
        Some(BtfError::Truncated)
    );
}

#[test]
fn rejects_garbage() {
    assert_eq!(
        Btf::index(&b"not btf at all, not at all"[..], "outer").err(),
        Some(BtfError::BadHeader)
    );
    let mut truncated = blob();
    truncated.truncate(40);
    assert_eq!(
        Btf::index(&truncated[..], "outer").err(),
        Some(BtfError::Truncated)
    );
}

#[test]
fn finds_the_task_runtime_in_this_kernel() {
    let offsets = task_offsets().expect("this kernel has BTF with task_struct.se.sum_exec_runtime");
    for offset in [offsets.runtime, offsets.start_time] {
        assert!(
            offset > 0 && offset < 16384 && offset % 8 == 0,
            "implausible offset {offset}"
        );
    }
}
