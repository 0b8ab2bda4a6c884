//! The loaded object's maps and programs, taken out by name: the drainer's
//! maps, the unwinder's, and the programs to attach.

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf, StackTraceMap},
};
use profiler_common::{
    SampleKey, SampleValue, UnwindProcess, UnwindTableRange, UnwoundStack, maps, python::PythonProcess,
};

use super::{
    super::drain::{UnwoundMaps, UserStackMaps},
    CollectError, Drainer,
    row_groups::RowGroups,
};

/// The maps the daemon fills for the sampler's own walk (auto mode).
pub struct UnwindMaps {
    pub rows: RowGroups,
    /// The first pc of each chunk of `rows`.
    pub chunk_pcs: Array<MapData, u32>,
    pub tables: Array<MapData, UnwindTableRange>,
    pub processes: HashMap<MapData, u32, UnwindProcess>,
    /// Where each CPython process's interpreter is; None with Python frames off.
    pub python: Option<HashMap<MapData, u32, PythonProcess>>,
    /// Code objects the sampler announces (see `python::prefetch`).
    pub python_codes: Option<RingBuf<MapData>>,
}

/// The unwinder's maps, when the sampler walks with tables (`python`: and
/// CPython frames).
pub(super) fn take_unwind_maps(ebpf: &mut Ebpf, python: bool) -> Result<UnwindMaps, CollectError> {
    Ok(UnwindMaps {
        rows: RowGroups::new(convert(ebpf, maps::UNWIND_ROWS)?),
        chunk_pcs: convert(ebpf, maps::UNWIND_CHUNK_PCS)?,
        tables: convert(ebpf, maps::UNWIND_TABLES)?,
        processes: convert(ebpf, maps::UNWIND_PROCESSES)?,
        python: if python {
            Some(convert(ebpf, maps::PYTHON_PROCESSES)?)
        } else {
            None
        },
        python_codes: if python {
            Some(convert(ebpf, maps::PYTHON_CODES)?)
        } else {
            None
        },
    })
}

pub(super) fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, CollectError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let program = ebpf.program_mut(name).ok_or(CollectError::Program {
        name,
        source: aya::programs::ProgramError::UnexpectedProgramType,
    })?;
    program
        .try_into()
        .map_err(|source| CollectError::Program { name, source })
}

pub(super) fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, CollectError> {
    ebpf.take_map(name).ok_or(CollectError::MissingMap { name })
}

pub(super) fn convert<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, CollectError> {
    T::try_from(take_map(ebpf, name)?).map_err(|source| CollectError::Map { name, source })
}

pub(super) fn take_drainer(ebpf: &mut Ebpf, unwound: bool) -> Result<Drainer, CollectError> {
    let counts: [HashMap<MapData, SampleKey, SampleValue>; 2] =
        [convert(ebpf, maps::COUNTS[0])?, convert(ebpf, maps::COUNTS[1])?];
    let user_stacks = if unwound {
        let stacks: [HashMap<MapData, u32, UnwoundStack>; 2] = [
            convert(ebpf, maps::UNWOUND_STACKS[0])?,
            convert(ebpf, maps::UNWOUND_STACKS[1])?,
        ];
        let tails: [HashMap<MapData, u32, UnwoundStack>; 2] = [
            convert(ebpf, maps::UNWOUND_TAILS[0])?,
            convert(ebpf, maps::UNWOUND_TAILS[1])?,
        ];
        UserStackMaps::Unwound(Box::new(UnwoundMaps { stacks, tails }))
    } else {
        let maps: [StackTraceMap<MapData>; 2] = [
            convert(ebpf, maps::USER_STACKS[0])?,
            convert(ebpf, maps::USER_STACKS[1])?,
        ];
        UserStackMaps::StackTraces(Box::new(maps))
    };
    let kernel_stacks: [StackTraceMap<MapData>; 2] = [
        convert(ebpf, maps::KERNEL_STACKS[0])?,
        convert(ebpf, maps::KERNEL_STACKS[1])?,
    ];
    let control: Array<MapData, u32> = convert(ebpf, maps::CONTROL)?;
    let counters: PerCpuArray<MapData, u64> = convert(ebpf, maps::COUNTERS)?;
    let spilled: RingBuf<MapData> = convert(ebpf, maps::SPILLED_SAMPLES)?;
    Ok(Drainer::new(
        counts,
        user_stacks,
        kernel_stacks,
        control,
        counters,
        spilled,
    ))
}
