//! CFI built with gimli's writer, compiled: what the compiler's tests feed it.

use std::ops::Range;

use gimli::{
    BaseAddresses, DwOp, EhFrame, Encoding, Format, LittleEndian, Register, X86_64, constants,
    write::{
        self, Address, CallFrameInstruction as Do, CommonInformationEntry, EndianVec, Expression,
        FrameDescriptionEntry, FrameTable,
    },
};

use super::unwind_table::{Compiled, Compiler, Limits, TableError};

pub(super) const RSP: Register = X86_64::RSP;
pub(super) const RBP: Register = X86_64::RBP;
pub(super) const RA: Register = X86_64::RA;
pub(super) const CODE: [Range<u64>; 1] = code(0x1000, 0x10_0000);

/// The executable segments: one range.
pub(super) const fn code(start: u64, end: u64) -> [Range<u64>; 1] {
    [Range { start, end }]
}

pub(super) fn encoding() -> Encoding {
    Encoding {
        format: Format::Dwarf32,
        version: 1,
        address_size: 8,
    }
}

/// x86-64's usual CIE: CFA = rsp + 8, return address at CFA - 8.
pub(super) fn cie(signal: bool) -> CommonInformationEntry {
    cie_aligned(signal, -8)
}

/// With another data alignment, to express offsets GCC never emits.
pub(super) fn cie_aligned(signal: bool, data_alignment: i8) -> CommonInformationEntry {
    let mut cie = CommonInformationEntry::new(encoding(), 1, data_alignment, RA);
    cie.add_instruction(Do::Cfa(RSP, 8));
    cie.add_instruction(Do::Offset(RA, -8));
    cie.signal_trampoline = signal;
    cie
}

/// One FDE: its start, length and (offset, instruction) list.
pub(super) type Fde = (u64, u32, Vec<(u32, Do)>);

pub(super) fn fde((start, len, instructions): Fde) -> FrameDescriptionEntry {
    let mut fde = FrameDescriptionEntry::new(Address::Constant(start), len);
    for (offset, instruction) in instructions {
        fde.add_instruction(offset, instruction);
    }
    fde
}

pub(super) fn eh_frame(signal: bool, fdes: Vec<Fde>) -> Vec<u8> {
    eh_frame_of(cie(signal), fdes)
}

pub(super) fn eh_frame_of(cie: CommonInformationEntry, fdes: Vec<Fde>) -> Vec<u8> {
    let mut table = FrameTable::default();
    let id = table.add_cie(cie);
    for entry in fdes {
        table.add_fde(id, fde(entry));
    }
    let mut out = write::EhFrame(EndianVec::new(LittleEndian));
    table.write_eh_frame(&mut out).expect("writing .eh_frame");
    out.0.into_vec()
}

pub(super) fn add_eh_frame(compiler: &mut Compiler<'_>, bytes: &[u8]) -> Result<(), TableError> {
    let section = EhFrame::new(bytes, LittleEndian);
    compiler.add(&section, &BaseAddresses::default().set_eh_frame(0), ".eh_frame")
}

pub(super) fn compile_with(bytes: &[u8], limits: Limits) -> Result<Compiled, TableError> {
    let mut compiler = Compiler::new(&CODE, limits);
    add_eh_frame(&mut compiler, bytes)?;
    compiler.finish()
}

pub(super) fn compile(fdes: Vec<Fde>) -> Compiled {
    compile_with(&eh_frame(false, fdes), Limits::FILE).expect("a table")
}

/// (pc, cfa rule, cfa offset, rbp rule, rbp offset) per row.
pub(super) fn rows(compiled: &Compiled) -> Vec<(u32, u8, u16, u8, i8)> {
    compiled
        .rows
        .iter()
        .map(|row| {
            (
                row.pc,
                row.cfa_rule(),
                row.cfa_offset,
                row.rbp_rule(),
                row.rbp_offset,
            )
        })
        .collect()
}

/// GCC's and binutils' PLT expression, with `threshold` in `DW_OP_lit<threshold>; DW_OP_ge`.
pub(super) fn plt_expression(threshold: u8) -> Expression {
    let mut expression = Expression::new();
    expression.op_breg(RSP, 8);
    expression.op_breg(RA, 0);
    expression.op(constants::DW_OP_lit15);
    expression.op(constants::DW_OP_and);
    expression.op(DwOp(constants::DW_OP_lit0.0 + threshold));
    expression.op(constants::DW_OP_ge);
    expression.op(constants::DW_OP_lit3);
    expression.op(constants::DW_OP_shl);
    expression.op(constants::DW_OP_plus);
    expression
}

pub(super) fn deref(register: Register, a: i64, b: Option<u64>) -> Expression {
    let mut expression = Expression::new();
    expression.op_breg(register, a);
    expression.op_deref();
    if let Some(b) = b {
        expression.op_plus_uconst(b);
    }
    expression
}
