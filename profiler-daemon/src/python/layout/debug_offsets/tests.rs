use super::*;

/// A struct of `tables` as CPython `hex` would write it, its offsets
/// those of `layout` (and each table's size 64 KiB, past any of them).
fn encode(tables: Tables, fields: Fields, hex: u64, layout: &Layout) -> Vec<u8> {
    let mut bytes = vec![0; struct_len(tables)];
    bytes[..8].copy_from_slice(COOKIE);
    bytes[8..16].copy_from_slice(&hex.to_ne_bytes());
    let code = layout.code;
    let strings = layout.strings;
    for (field, value) in [
        (fields.interpreters_head, layout.runtime_interpreters_head),
        (fields.threads_head, layout.interpreter_threads_head),
        (fields.thread_next, layout.thread_next),
        (fields.thread_current_frame, layout.thread_frame),
        (fields.thread_id, layout.thread_id),
        (fields.frame_previous, layout.frame_previous),
        (fields.frame_executable, layout.frame_code),
        (fields.frame_instr_ptr, layout.frame_instruction),
        (fields.frame_owner, layout.frame_entry.unwrap_or_default()),
        (fields.code_filename, code.filename),
        (fields.code_name, code.name),
        (fields.code_qualname, code.qualname.unwrap_or_default()),
        (fields.code_linetable, code.line_table),
        (fields.code_firstlineno, code.first_line),
        (fields.code_argcount, code.argcount),
        (
            fields.code_co_code_adaptive,
            code.instructions.unwrap_or_default(),
        ),
        (fields.bytes_ob_size, strings.bytes_size),
        (fields.bytes_ob_sval, strings.bytes_data),
        (fields.unicode_state, strings.state),
        (fields.unicode_length, strings.length),
        (fields.unicode_asciiobject_size, strings.ascii_data),
    ] {
        bytes[field.size_at..field.size_at + 8].copy_from_slice(&(1u64 << 16).to_ne_bytes());
        bytes[field.at..field.at + 8].copy_from_slice(&u64::from(value).to_ne_bytes());
    }
    bytes
}

fn put(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_ne_bytes());
}

/// 3.13.0 final.
const HEX_3_13: u64 = 0x030d_00f0;
/// 3.14.0 final.
const HEX_3_14: u64 = 0x030e_00f0;

#[test]
fn positions_match_the_3_13_header() {
    // offsetof(_Py_DebugOffsets, ...) and sizeof, printed by a C program
    // built against 3.13.0's pycore_runtime.h.
    let f = FIELDS_3_13;
    assert_eq!(struct_len(TABLES_3_13), 584);
    assert_eq!(
        [
            f.interpreters_head.at,
            f.threads_head.at,
            f.thread_next.at,
            f.thread_current_frame.at
        ],
        [40, 72, 168, 184]
    );
    assert_eq!(
        [
            f.thread_id.at,
            f.frame_previous.at,
            f.frame_executable.at,
            f.frame_instr_ptr.at
        ],
        [192, 232, 240, 248]
    );
    assert_eq!(
        [
            f.frame_owner.at,
            f.code_filename.at,
            f.code_name.at,
            f.code_qualname.at
        ],
        [264, 280, 288, 296]
    );
    assert_eq!(
        [
            f.code_linetable.at,
            f.code_firstlineno.at,
            f.code_argcount.at,
            f.code_co_code_adaptive.at
        ],
        [304, 312, 320, 344]
    );
    assert_eq!([f.bytes_ob_size.at, f.bytes_ob_sval.at], [520, 528]);
    assert_eq!(
        [
            f.unicode_state.at,
            f.unicode_length.at,
            f.unicode_asciiobject_size.at
        ],
        [544, 552, 560]
    );
    assert_eq!([f.thread_id.size_at, f.code_name.size_at], [152, 272]);
}

#[test]
fn positions_of_3_14_counted_by_hand() {
    // From the 3.14 header: 16 interpreter fields, 8 frame fields, 11
    // code fields and set_object before dict_object; 760 bytes in all.
    let f = FIELDS_3_14;
    assert_eq!(MAX_LEN, 760);
    assert_eq!(
        [f.threads_head.at, f.thread_next.at, f.thread_id.at],
        [72, 192, 216]
    );
    assert_eq!(
        [f.frame_previous.at, f.frame_owner.at, f.code_filename.at],
        [256, 288, 320]
    );
    assert_eq!(
        [
            f.code_co_code_adaptive.at,
            f.bytes_ob_size.at,
            f.unicode_asciiobject_size.at
        ],
        [384, 600, 640]
    );
}

#[test]
fn round_trips_3_13_and_3_14() {
    let bytes = encode(TABLES_3_13, FIELDS_3_13, HEX_3_13, &known::V3_13);
    assert_eq!(from_debug_offsets(&bytes), Ok(known::V3_13));
    // Longer input (a read of MAX_LEN bytes) is fine.
    let mut longer = bytes.clone();
    longer.resize(MAX_LEN + 100, 0xff);
    assert_eq!(from_debug_offsets(&longer), Ok(known::V3_13));

    let mut expected = known::V3_13;
    expected.version = Version { major: 3, minor: 14 };
    expected.thread_id = 160;
    let bytes = encode(TABLES_3_14, FIELDS_3_14, HEX_3_14, &expected);
    assert_eq!(from_debug_offsets(&bytes), Ok(expected));
}

#[test]
fn rejects_truncated_input() {
    let bytes = encode(TABLES_3_13, FIELDS_3_13, HEX_3_13, &known::V3_13);
    for len in 0..bytes.len() {
        let error = from_debug_offsets(&bytes[..len]).expect_err("a cut struct");
        let need = if len < HEADER { HEADER } else { bytes.len() };
        assert_eq!(
            error,
            DebugOffsetsError::Truncated { have: len, need },
            "{len} bytes"
        );
    }
}

#[test]
fn rejects_bad_cookie_version_and_free_threading() {
    let good = encode(TABLES_3_13, FIELDS_3_13, HEX_3_13, &known::V3_13);
    let mut bytes = good.clone();
    bytes[..8].copy_from_slice(b"xdebugpz");
    assert_eq!(from_debug_offsets(&bytes), Err(DebugOffsetsError::BadCookie));
    assert_eq!(
        from_debug_offsets(&[0; MAX_LEN]),
        Err(DebugOffsetsError::BadCookie)
    );

    for hex in [0x030c_00f0, 0x030f_00a1, 0x0400_00f0, (1 << 40) | HEX_3_13, 0] {
        let mut bytes = good.clone();
        put(&mut bytes, 8, hex);
        assert_eq!(
            from_debug_offsets(&bytes),
            Err(DebugOffsetsError::UnsupportedVersion(hex))
        );
    }

    for flag in [1, u64::MAX] {
        let mut bytes = good.clone();
        put(&mut bytes, 16, flag);
        assert_eq!(
            from_debug_offsets(&bytes),
            Err(DebugOffsetsError::FreeThreaded(Version { major: 3, minor: 13 }))
        );
    }
}

#[test]
fn rejects_absurd_offsets() {
    let good = encode(TABLES_3_13, FIELDS_3_13, HEX_3_13, &known::V3_13);
    let version = Version { major: 3, minor: 13 };
    for field in [
        FIELDS_3_13.thread_next,
        FIELDS_3_13.code_name,
        FIELDS_3_13.unicode_asciiobject_size,
    ] {
        for value in [MAX_OFFSET, 1 << 20, u64::from(u16::MAX), u64::MAX] {
            let mut bytes = good.clone();
            put(&mut bytes, field.size_at, u64::MAX);
            put(&mut bytes, field.at, value);
            let absurd = DebugOffsetsError::Absurd {
                version,
                table: field.table,
                field: field.name,
                value,
                size: u64::MAX,
            };
            assert_eq!(from_debug_offsets(&bytes), Err(absurd));
        }
    }
    // An offset past the end of the struct its table describes.
    let field = FIELDS_3_13.thread_id;
    let mut bytes = good.clone();
    put(&mut bytes, field.size_at, 159);
    assert!(matches!(
        from_debug_offsets(&bytes),
        Err(DebugOffsetsError::Absurd {
            field: "thread_id",
            value: 152,
            size: 159,
            ..
        })
    ));
    put(&mut bytes, field.size_at, 0);
    assert!(from_debug_offsets(&bytes).is_err());
}
