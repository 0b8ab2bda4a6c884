//! A process's entry for the sampler: its executable mappings, each with its
//! file's table and load bias.

use profiler_common::{MAX_UNWIND_MAPPINGS, UnwindMapping, UnwindProcess};

use crate::collect::{MappedFile, SnapshotMapping};

/// A PT_LOAD segment of a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadSegment {
    pub file_offset: u64,
    pub vaddr: u64,
    pub file_size: u64,
}

const PAGE: u64 = 4096;

/// Runtime address minus ELF virtual address for a mapping of `offset` at
/// `start`: the segment holding that file offset says which vaddr it is.
/// Segments need not start on a page; their mappings do, and a segment's
/// vaddr and offset agree modulo the page size. When a page holds the end of
/// one segment and the start of the next (lld packs them so), the mapping
/// is of the later one: an executable mapping starts where the text does.
pub fn load_bias(start: u64, offset: u64, segments: &[LoadSegment]) -> Option<u64> {
    let segment = segments
        .iter()
        .filter(|segment| {
            let aligned_offset = segment.file_offset & !(PAGE - 1);
            segment
                .file_offset
                .checked_add(segment.file_size)
                .is_some_and(|end| aligned_offset <= offset && offset < end)
        })
        .max_by_key(|segment| segment.file_offset)?;
    let aligned_offset = segment.file_offset & !(PAGE - 1);
    let vaddr = (segment.vaddr & !(PAGE - 1)).wrapping_add(offset - aligned_offset);
    Some(start.wrapping_sub(vaddr))
}

/// The entry for `mappings` (sorted by start, as snapshots are); `table_of`
/// gives a file's table id and segments, if it has a table.
pub fn build<'a>(
    mappings: &[SnapshotMapping],
    table_of: impl Fn(&MappedFile) -> Option<(u32, &'a [LoadSegment])>,
) -> Box<UnwindProcess> {
    let mut entry = Box::new(UnwindProcess {
        count: 0,
        python: 0,
        mappings: [UnwindMapping::default(); MAX_UNWIND_MAPPINGS],
    });
    let mut count = 0;
    for mapping in mappings.iter().filter(|mapping| mapping.start < mapping.end) {
        if count == MAX_UNWIND_MAPPINGS {
            break;
        }
        // Keep the order strict: the sampler binary-searches it.
        if count > 0 && mapping.start < entry.mappings[count - 1].end {
            continue;
        }
        let (table, bias) = mapping
            .file
            .as_deref()
            .and_then(&table_of)
            .filter(|(id, _)| *id != 0)
            .and_then(|(id, segments)| Some((id, load_bias(mapping.start, mapping.offset, segments)?)))
            .unwrap_or((0, 0));
        entry.mappings[count] = UnwindMapping {
            start: mapping.start,
            end: mapping.end,
            bias,
            table,
            reserved: 0,
        };
        count += 1;
    }
    entry.count = count as u32;
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_object_maps_its_text_at_its_base() {
        // libc-like: text segment at offset 0x26000, vaddr 0x26000.
        let segments = [
            LoadSegment {
                file_offset: 0,
                vaddr: 0,
                file_size: 0x26000,
            },
            LoadSegment {
                file_offset: 0x26000,
                vaddr: 0x26000,
                file_size: 0x155000,
            },
        ];
        let base = 0x7f00_0000_0000;
        assert_eq!(load_bias(base + 0x26000, 0x26000, &segments), Some(base));
    }

    #[test]
    fn a_page_shared_by_two_segments_maps_the_later_one() {
        // lld: rodata ends at 0x182a8 and text starts at offset 0x182b0 with
        // vaddr 0x192b0; the text mapping is offset 0x18000 at base + 0x19000.
        let segments = [
            LoadSegment {
                file_offset: 0,
                vaddr: 0,
                file_size: 0x182a8,
            },
            LoadSegment {
                file_offset: 0x182b0,
                vaddr: 0x192b0,
                file_size: 0x3f290,
            },
        ];
        let base = 0x5555_5555_0000;
        assert_eq!(load_bias(base + 0x19000, 0x18000, &segments), Some(base));
    }

    #[test]
    fn an_unaligned_segment_still_finds_its_page() {
        // Text at file offset 0x1040 with vaddr 0x401040, mapped from
        // offset 0x1000 at 0x401000 (a non-PIE executable): bias 0.
        let segments = [LoadSegment {
            file_offset: 0x1040,
            vaddr: 0x401040,
            file_size: 0x2000,
        }];
        assert_eq!(load_bias(0x401000, 0x1000, &segments), Some(0));
        assert_eq!(
            load_bias(0x401000, 0x9000, &segments),
            None,
            "offset outside every segment"
        );
    }
}
