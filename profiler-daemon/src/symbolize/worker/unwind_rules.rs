//! What one row of evaluated CFI tells the BPF walker: gimli's rules mapped
//! onto the few the walker can follow (the contract is in profiler-common:
//! `UnwindRow`, `CfaRule`, `RbpRule`). Anything else becomes `Unsupported`,
//! which the walker counts, rather than a row that unwinds wrongly.

use gimli::{
    CfaRule as Cfa, Encoding, Expression, Format, Operation, Reader, RegisterRule, UnwindSection,
    UnwindTableRow, X86_64,
};
use profiler_common::{CfaRule, RbpRule, UnwindRow};

/// A row without its pc: consecutive rows with equal rules merge into one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rules {
    cfa_offset: u16,
    rbp_offset: i8,
    rules: u8,
}

impl Rules {
    pub const NO_INFO: Self = Self::only(CfaRule::NoInfo);
    pub const SIGNAL: Self = Self::only(CfaRule::Signal);
    pub const END: Self = Self::only(CfaRule::End);
    pub const UNSUPPORTED: Self = Self::only(CfaRule::Unsupported);

    /// Rules whose offsets mean nothing are zeroed, so that they merge.
    const fn only(cfa: CfaRule) -> Self {
        Self::new(cfa, 0, RbpRule::Unchanged, 0)
    }

    const fn new(cfa: CfaRule, cfa_offset: u16, rbp: RbpRule, rbp_offset: i8) -> Self {
        Self {
            cfa_offset,
            rbp_offset,
            rules: cfa as u8 | (rbp as u8) << 4,
        }
    }

    pub const fn at(self, pc: u32) -> UnwindRow {
        UnwindRow {
            pc,
            cfa_offset: self.cfa_offset,
            rbp_offset: self.rbp_offset,
            rules: self.rules,
        }
    }

    pub const fn of(row: &UnwindRow) -> Self {
        Self {
            cfa_offset: row.cfa_offset,
            rbp_offset: row.rbp_offset,
            rules: row.rules,
        }
    }
}

/// Whether the walker cannot follow this row (its CFA or its rbp).
pub(super) fn unsupported(row: &UnwindRow) -> bool {
    row.cfa_rule() == CfaRule::Unsupported as u8 || row.rbp_rule() == RbpRule::Unsupported as u8
}

/// The rules of one row of an FDE whose CIE is an ordinary x86-64 one
/// (return address in register 16, no signal frame).
pub(super) fn rules_of<R, S>(row: &UnwindTableRow<R::Offset>, section: &S) -> Rules
where
    R: Reader,
    S: UnwindSection<R>,
{
    // The walker reads the return address at CFA - 8: what a call pushed.
    match row.register(X86_64::RA) {
        None | Some(RegisterRule::Offset(-8)) => {}
        Some(RegisterRule::Undefined) => return Rules::END,
        Some(_) => return Rules::UNSUPPORTED,
    }
    let (cfa, cfa_offset) = match row.cfa() {
        Cfa::RegisterAndOffset { register, offset } => {
            let rule = match *register {
                X86_64::RSP => CfaRule::Rsp,
                X86_64::RBP => CfaRule::Rbp,
                _ => return Rules::UNSUPPORTED,
            };
            match eighths(*offset).and_then(|offset| u16::try_from(offset).ok()) {
                Some(offset) => (rule, offset),
                None => return Rules::UNSUPPORTED,
            }
        }
        Cfa::Expression(expression) => match expression.get(section).ok().and_then(cfa_expression) {
            Some(rule) => rule,
            None => return Rules::UNSUPPORTED,
        },
    };
    let (rbp, rbp_offset) = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => (RbpRule::Unchanged, 0),
        Some(RegisterRule::Offset(offset)) => eighths(offset)
            .and_then(|offset| i8::try_from(offset).ok())
            .map_or((RbpRule::Unsupported, 0), |offset| (RbpRule::Offset, offset)),
        Some(_) => (RbpRule::Unsupported, 0),
    };
    Rules::new(cfa, cfa_offset, rbp, rbp_offset)
}

/// `offset / 8` when `offset` is a multiple of 8 (the walker's unit).
fn eighths(offset: i64) -> Option<i64> {
    (offset % 8 == 0).then_some(offset / 8)
}

/// The longest expression recognised (the PLT one); longer ones are not decoded.
const MAX_EXPRESSION_OPS: usize = 9;

/// The CFA expressions the walker evaluates, recognised by their operations
/// (so an equivalent encoding, e.g. `DW_OP_bregx` for `DW_OP_breg7`, matches too).
fn cfa_expression<R: Reader>(expression: Expression<R>) -> Option<(CfaRule, u16)> {
    // Only DW_OP_call_ref and typed operations depend on the encoding; none is accepted.
    let encoding = Encoding {
        format: Format::Dwarf32,
        version: 4,
        address_size: 8,
    };
    let mut input = expression.0;
    let mut ops = Vec::with_capacity(MAX_EXPRESSION_OPS);
    while !input.is_empty() {
        if ops.len() == MAX_EXPRESSION_OPS {
            return None;
        }
        ops.push(Operation::parse(&mut input, encoding).ok()?);
    }
    use Operation::{And, Deref, Ge, Plus, PlusConstant, RegisterOffset, Shl, UnsignedConstant};
    match ops.as_slice() {
        // GCC's and binutils' PLT stubs (16 bytes each): after the stub's
        // `jmp *GOT` at offset 11 the linker pushed one more word. Only the
        // `>= 11` form occurs on this distribution (libc, libstdc++, python3,
        // /usr/lib/*.so*); the `>= 10` variant is not accepted unseen.
        [
            RegisterOffset {
                register: X86_64::RSP,
                offset: 8,
                ..
            },
            RegisterOffset {
                register: X86_64::RA,
                offset: 0,
                ..
            },
            UnsignedConstant { value: 15 },
            And,
            UnsignedConstant { value: 11 },
            Ge,
            UnsignedConstant { value: 3 },
            Shl,
            Plus,
        ] => Some((CfaRule::Plt, 0)),
        // Stack realignment: the CFA was saved in the frame.
        [
            RegisterOffset {
                register: X86_64::RSP,
                offset,
                ..
            },
            Deref {
                size: 8,
                space: false,
                ..
            },
        ] => deref_rsp(*offset, 0),
        [
            RegisterOffset {
                register: X86_64::RSP,
                offset,
                ..
            },
            Deref {
                size: 8,
                space: false,
                ..
            },
            PlusConstant { value },
        ] => deref_rsp(*offset, *value),
        _ => None,
    }
}

/// `CFA = *(rsp + a) + b`, both offsets in 8-byte units packed in a byte each.
fn deref_rsp(a: i64, b: u64) -> Option<(CfaRule, u16)> {
    let a = u8::try_from(eighths(a)?).ok()?;
    let b = u8::try_from(eighths(i64::try_from(b).ok()?)?).ok()?;
    Some((CfaRule::DerefRsp, u16::from(a) | u16::from(b) << 8))
}

#[cfg(test)]
#[path = "unwind_rules_tests.rs"]
mod tests;
