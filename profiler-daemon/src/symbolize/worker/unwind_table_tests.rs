//! The table's layout, its bounds, and hostile bytes, on CFI built with
//! gimli's writer.

use gimli::{
    DebugFrame, LittleEndian, Register,
    write::{self, CallFrameInstruction as Do, EndianVec, FrameTable},
};
use profiler_common::CfaRule;
use proptest::prelude::*;

use super::super::unwind_test_cfi::*;
use super::*;

#[test]
fn rows_are_laid_out_by_pc_with_gaps_and_merged() {
    let compiled = compile(vec![
        // Listed out of order, as linkers do.
        (0x3000, 0x10, vec![]),
        (
            0x1000,
            0x20,
            vec![
                (1, Do::CfaOffset(16)),
                (2, Do::Offset(Register(3), -24)), // rbx: not ours, merges
                (4, Do::CfaOffset(24)),
            ],
        ),
        (0x1020, 0x10, vec![]), // adjacent: no gap row
    ]);
    assert_eq!(
        rows(&compiled),
        vec![
            (0x1000, CfaRule::Rsp as u8, 1, 0, 0),
            (0x1001, CfaRule::Rsp as u8, 2, 0, 0),
            (0x1004, CfaRule::Rsp as u8, 3, 0, 0),
            (0x1020, CfaRule::Rsp as u8, 1, 0, 0),
            (0x1030, CfaRule::NoInfo as u8, 0, 0, 0),
            (0x3000, CfaRule::Rsp as u8, 1, 0, 0),
            (0x3010, CfaRule::NoInfo as u8, 0, 0, 0),
        ]
    );
    // 0x1000, 0x1001, 0x1002 (merged), 0x1004; 0x1020; gap; 0x3000; end.
    assert_eq!(compiled.rows_before_merge, 8);
    assert_eq!((compiled.fdes, compiled.fdes_skipped), (3, 0));
    assert_eq!(compiled.sources, [".eh_frame"]);
}

#[test]
fn overlapping_and_misplaced_fdes_are_skipped_the_same_way_in_any_order() {
    let outer = (0x1000, 0x100, vec![(8, Do::CfaOffset(16))]);
    let inner = (0x1010, 0x10, vec![(0, Do::CfaOffset(64))]);
    let outside = (0x20_0000, 0x10, vec![]); // not in an executable segment
    let at_zero = (0, 0x10, vec![]); // a discarded function's FDE
    let forward = compile(vec![
        outer.clone(),
        inner.clone(),
        outside.clone(),
        at_zero.clone(),
    ]);
    let backward = compile(vec![at_zero, outside, inner, outer]);
    for compiled in [&forward, &backward] {
        assert_eq!(
            rows(compiled),
            vec![
                (0x1000, CfaRule::Rsp as u8, 1, 0, 0),
                (0x1008, CfaRule::Rsp as u8, 2, 0, 0),
                (0x1100, CfaRule::NoInfo as u8, 0, 0, 0),
            ]
        );
        assert_eq!((compiled.fdes, compiled.fdes_skipped), (1, 3));
    }
}

#[test]
fn an_earlier_section_wins_where_sections_overlap() {
    let eh = eh_frame(false, vec![(0x1000, 0x10, vec![(0, Do::CfaOffset(16))])]);
    let mut table = FrameTable::default();
    let id = table.add_cie(cie(false));
    table.add_fde(id, fde((0x1000, 0x10, vec![(0, Do::CfaOffset(32))])));
    table.add_fde(id, fde((0x1010, 0x10, vec![(0, Do::CfaOffset(48))])));
    let mut out = write::DebugFrame(EndianVec::new(LittleEndian));
    table.write_debug_frame(&mut out).expect("writing .debug_frame");
    let debug = out.0.into_vec();

    let mut compiler = Compiler::new(&CODE, Limits::FILE);
    add_eh_frame(&mut compiler, &eh).expect("eh_frame");
    let mut section = DebugFrame::new(&debug, LittleEndian);
    section.set_address_size(8);
    compiler
        .add(&section, &BaseAddresses::default(), ".debug_frame")
        .expect("debug_frame");
    let compiled = compiler.finish().expect("a table");
    assert_eq!(
        rows(&compiled),
        vec![
            (0x1000, CfaRule::Rsp as u8, 2, 0, 0),
            (0x1010, CfaRule::Rsp as u8, 6, 0, 0),
            (0x1020, CfaRule::NoInfo as u8, 0, 0, 0),
        ]
    );
    assert_eq!(compiled.sources, [".eh_frame", ".debug_frame"]);
    assert_eq!(
        (compiled.fdes, compiled.fdes_skipped),
        (2, 0),
        "a duplicate is not an error"
    );
}

#[test]
fn bounds_and_addresses_refuse_the_file() {
    let code = code(0x1_0000_0000 - 0x100, 0x2_0000_0000);
    let bytes = eh_frame(false, vec![(0x1_0000_0000 - 0x10, 0x10, vec![])]);
    let mut compiler = Compiler::new(&code, Limits::FILE);
    let result = add_eh_frame(&mut compiler, &bytes);
    assert_eq!(
        result,
        Err(TableError::BeyondFourGiB(0x1_0000_0000)),
        "the end needs a row too"
    );

    let many: Vec<Fde> = (0..10)
        .map(|index| (0x1000 + index * 0x10, 0x10, vec![(4, Do::CfaOffset(16))]))
        .collect();
    let bytes = eh_frame(false, many);
    let limits = |raw_rows, table_rows, evaluated_bytes| Limits {
        raw_rows,
        fdes: 10,
        table_rows,
        evaluated_bytes,
    };
    assert!(compile_with(&bytes, limits(20, 100, 1 << 20)).is_ok());
    assert_eq!(
        compile_with(&bytes, limits(19, 100, 1 << 20)).err(),
        Some(TableError::TooManyRows(19))
    );
    assert_eq!(
        compile_with(&bytes, limits(20, 20, 1 << 20)).err(),
        Some(TableError::TooManyRows(20))
    );
    assert!(matches!(
        compile_with(&bytes, limits(20, 100, 100)),
        Err(TableError::TooMuchCfi(100))
    ));
    let nine_fdes = Limits {
        fdes: 9,
        ..limits(20, 100, 1 << 20)
    };
    assert_eq!(
        compile_with(&bytes, nine_fdes).err(),
        Some(TableError::TooManyFdes(9))
    );
    assert_eq!(compile_with(&[], Limits::FILE).err(), Some(TableError::NoFdes));
}

#[test]
fn an_fde_gimli_cannot_evaluate_is_skipped_and_counted() {
    // DW_CFA_restore_state with nothing remembered.
    let compiled = compile(vec![
        (0x1000, 0x10, vec![(4, Do::RestoreState)]),
        (0x1010, 0x10, vec![]),
    ]);
    assert_eq!((compiled.fdes, compiled.fdes_skipped), (1, 1));
    assert_eq!(compiled.rows[0].pc, 0x1010);
}

/// A realistic section to mutate: several FDEs with each kind of rule.
fn sample() -> Vec<u8> {
    eh_frame(
        false,
        vec![
            (
                0x1000,
                0x40,
                vec![
                    (1, Do::CfaOffset(16)),
                    (2, Do::Offset(RBP, -16)),
                    (4, Do::Cfa(RBP, 16)),
                ],
            ),
            (
                0x1040,
                0x40,
                vec![(0, Do::CfaExpression(plt_expression(11))), (6, Do::RememberState)],
            ),
            (
                0x1080,
                0x40,
                vec![
                    (3, Do::CfaExpression(deref(RSP, 40, Some(8)))),
                    (9, Do::Undefined(RA)),
                ],
            ),
        ],
    )
}

#[test]
fn the_sample_to_mutate_has_every_kind_of_rule() {
    let compiled = compile_with(&sample(), Limits::FILE).expect("a table");
    let kinds: Vec<u8> = compiled.rows.iter().map(|row| row.cfa_rule()).collect();
    for kind in [
        CfaRule::Rsp,
        CfaRule::Rbp,
        CfaRule::Plt,
        CfaRule::DerefRsp,
        CfaRule::End,
        CfaRule::NoInfo,
    ] {
        assert!(kinds.contains(&(kind as u8)), "{kind:?} missing from {kinds:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn mutated_cfi_never_panics_and_stays_sorted(
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = sample();
        for (index, value) in flips {
            let len = bytes.len();
            bytes[index % len] = value;
        }
        let code = code(0, u64::MAX);
        let mut compiler = Compiler::new(&code, Limits::FILE);
        if add_eh_frame(&mut compiler, &bytes).is_ok()
            && let Ok(compiled) = compiler.finish()
        {
            prop_assert!(compiled.rows.windows(2).all(|pair| pair[0].pc < pair[1].pc));
            prop_assert_eq!(compiled.rows.last().map(|row| row.cfa_rule()), Some(CfaRule::NoInfo as u8));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let code = code(0, u64::MAX);
        let mut compiler = Compiler::new(&code, Limits::FILE);
        let _ = add_eh_frame(&mut compiler, &bytes);
        let _ = compiler.finish();
        let mut compiler = Compiler::new(&code, Limits::FILE);
        let mut section = DebugFrame::new(&bytes, LittleEndian);
        section.set_address_size(8);
        let _ = compiler.add(&section, &BaseAddresses::default(), ".debug_frame");
        let _ = compiler.finish();
    }
}
