//! Each mapping rule of the contract, on CFI built with gimli's writer.

use gimli::{
    Register, constants,
    write::{CallFrameInstruction as Do, Expression},
};
use profiler_common::{CfaRule, RbpRule};

use super::super::{unwind_table::Limits, unwind_test_cfi::*};

/// The rules of the one row an FDE at 0x1000 gets from `instructions` at offset 0.
fn single(instructions: Vec<Do>) -> (u8, u16, u8, i8) {
    let compiled = compile(vec![(
        0x1000,
        16,
        instructions.into_iter().map(|i| (0, i)).collect(),
    )]);
    let table = rows(&compiled);
    assert_eq!(table.len(), 2, "one row and the end: {table:x?}");
    assert_eq!(table[1], (0x1010, CfaRule::NoInfo as u8, 0, 0, 0));
    let (_, cfa, offset, rbp, rbp_offset) = table[0];
    (cfa, offset, rbp, rbp_offset)
}

const UNSUPPORTED: (u8, u16, u8, i8) = (CfaRule::Unsupported as u8, 0, 0, 0);

fn rsp(eighths: u16) -> (u8, u16, u8, i8) {
    (CfaRule::Rsp as u8, eighths, RbpRule::Unchanged as u8, 0)
}

#[test]
fn register_cfa_rules_take_offsets_in_eighths() {
    assert_eq!(single(vec![]), rsp(1));
    assert_eq!(single(vec![Do::CfaOffset(160)]), rsp(20));
    assert_eq!(single(vec![Do::CfaOffset(0)]), rsp(0));
    assert_eq!(single(vec![Do::Cfa(RBP, 16)]), (CfaRule::Rbp as u8, 2, 0, 0));
    assert_eq!(single(vec![Do::CfaOffset(8 * 65535)]), rsp(65535));
    assert_eq!(single(vec![Do::CfaOffset(8 * 65536)]), UNSUPPORTED, "too far");
    assert_eq!(
        single(vec![Do::CfaOffset(12)]),
        UNSUPPORTED,
        "not a multiple of 8"
    );
    assert_eq!(single(vec![Do::Cfa(RSP, -8)]), UNSUPPORTED, "negative");
    assert_eq!(
        single(vec![Do::Cfa(Register(12), 8)]),
        UNSUPPORTED,
        "another register"
    );
}

#[test]
fn rbp_rules() {
    let saved = |instruction| single(vec![Do::CfaOffset(16), instruction]);
    assert_eq!(
        saved(Do::Offset(RBP, -16)),
        (CfaRule::Rsp as u8, 2, RbpRule::Offset as u8, -2)
    );
    assert_eq!(
        saved(Do::Offset(RBP, -8 * 128)),
        (CfaRule::Rsp as u8, 2, RbpRule::Offset as u8, -128)
    );
    let unsupported = (CfaRule::Rsp as u8, 2, RbpRule::Unsupported as u8, 0);
    assert_eq!(saved(Do::Offset(RBP, -8 * 129)), unsupported, "beyond an i8");
    let odd = eh_frame_of(
        cie_aligned(false, -4),
        vec![(
            0x1000,
            16,
            vec![(0, Do::CfaOffset(16)), (0, Do::Offset(RBP, -12))],
        )],
    );
    let compiled = compile_with(&odd, Limits::FILE).expect("a table");
    assert_eq!(
        rows(&compiled)[0],
        (0x1000, CfaRule::Rsp as u8, 2, RbpRule::Unsupported as u8, 0)
    );
    assert_eq!(
        saved(Do::Register(RBP, Register(9))),
        unsupported,
        "in a register"
    );
    let mut expression = Expression::new();
    expression.op_breg(RSP, 8);
    assert_eq!(
        saved(Do::Expression(RBP, expression)),
        unsupported,
        "an expression"
    );
    assert_eq!(
        saved(Do::ValOffset(RBP, -16)),
        unsupported,
        "a value, not a location"
    );
    assert_eq!(saved(Do::SameValue(RBP)), rsp(2));
    assert_eq!(saved(Do::Undefined(RBP)), rsp(2));
}

#[test]
fn cfa_expressions_the_walker_evaluates() {
    let cfa = |expression| single(vec![Do::CfaExpression(expression)]);
    assert_eq!(cfa(plt_expression(11)), (CfaRule::Plt as u8, 0, 0, 0));
    assert_eq!(
        cfa(plt_expression(10)),
        UNSUPPORTED,
        "the >= 10 variant is not seen here"
    );
    let deref_rsp = |packed| (CfaRule::DerefRsp as u8, packed, 0, 0);
    assert_eq!(cfa(deref(RSP, 40, Some(8))), deref_rsp(5 | 1 << 8));
    assert_eq!(cfa(deref(RSP, 8 * 255, Some(8 * 255))), deref_rsp(255 | 255 << 8));
    assert_eq!(cfa(deref(RSP, 16, None)), deref_rsp(2));
    assert_eq!(cfa(deref(RSP, -8, Some(8))), UNSUPPORTED, "negative");
    assert_eq!(cfa(deref(RSP, 8 * 256, Some(8))), UNSUPPORTED, "beyond a byte");
    assert_eq!(cfa(deref(RSP, 40, Some(8 * 256))), UNSUPPORTED, "beyond a byte");
    assert_eq!(cfa(deref(RSP, 44, Some(8))), UNSUPPORTED, "not a multiple of 8");
    assert_eq!(cfa(deref(RBP, -40, None)), UNSUPPORTED, "rbp-based (GCC's DRAP)");
    let mut longer = plt_expression(11);
    longer.op(constants::DW_OP_nop);
    assert_eq!(cfa(longer), UNSUPPORTED, "more than the PLT expression");
}

#[test]
fn signal_frames_and_the_outermost_frame() {
    let bytes = eh_frame(
        true,
        vec![(0x1000, 16, vec![(0, Do::CfaExpression(deref(RSP, 160, None)))])],
    );
    let compiled = compile_with(&bytes, Limits::FILE).expect("a table");
    assert_eq!(rows(&compiled)[0], (0x1000, CfaRule::Signal as u8, 0, 0, 0));

    assert_eq!(single(vec![Do::Undefined(RA)]), (CfaRule::End as u8, 0, 0, 0));
    assert_eq!(
        single(vec![Do::Register(RA, Register(1))]),
        UNSUPPORTED,
        "return address elsewhere"
    );
}
