//! Batched calls split by count and by bytes: `SendMessageBatch` and `PutEvents` take at most 10
//! entries and 256 KiB in all. A batch grouped by count alone fails as a whole when its entries are
//! large together, and is retried grouped the same way, forever.

use std::ops::Range;

/// Entries per `SendMessageBatch` or `PutEvents` call.
pub const MAX_ENTRIES: usize = 10;
/// Bytes per `SendMessageBatch` or `PutEvents` call, all entries together (and per message).
pub const MAX_BATCH_BYTES: usize = 256 * 1024;

/// Splits entries of the given sizes, in order, into consecutive groups of at most `max_entries`
/// entries and `max_bytes` bytes in all. An entry larger than `max_bytes` on its own forms a group of
/// its own: its call fails alone instead of failing its neighbours.
pub fn split(
    sizes: impl IntoIterator<Item = usize>,
    max_entries: usize,
    max_bytes: usize,
) -> Vec<Range<usize>> {
    let mut groups = Vec::new();
    let (mut start, mut bytes, mut end) = (0, 0, 0);
    for size in sizes {
        if end > start && (end - start == max_entries || bytes + size > max_bytes) {
            groups.push(start..end);
            (start, bytes) = (end, 0);
        }
        bytes += size;
        end += 1;
    }
    if end > start {
        groups.push(start..end);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_bounded_by_count_and_bytes_and_keep_the_order() {
        assert_eq!(split([1; 25], 10, 100), vec![0..10, 10..20, 20..25]);
        // Ten 30 KB entries: eight fit under 256 KiB, two go in a second call.
        assert_eq!(
            split([30_000; 10], MAX_ENTRIES, MAX_BATCH_BYTES),
            vec![0..8, 8..10]
        );
        assert_eq!(split([60, 50, 40, 20], 10, 100), vec![0..1, 1..3, 3..4]);
        assert_eq!(split([60, 50, 40, 10], 10, 100), vec![0..1, 1..4]);
        assert_eq!(split([], 10, 100), Vec::<Range<usize>>::new());
    }

    #[test]
    fn an_entry_too_large_for_any_call_goes_alone() {
        assert_eq!(split([10, 500, 10], 10, 100), vec![0..1, 1..2, 2..3]);
        assert_eq!(split([500], 10, 100), vec![0..1]);
    }

    #[test]
    fn every_group_respects_both_limits() {
        let sizes: Vec<usize> = (0..200).map(|i| (i * 7919) % 120).collect();
        let groups = split(sizes.iter().copied(), 10, 100);
        let mut next = 0;
        for group in groups {
            assert_eq!(group.start, next);
            next = group.end;
            let bytes: usize = sizes[group.clone()].iter().sum();
            assert!(group.len() <= 10);
            assert!(bytes <= 100 || group.len() == 1, "{group:?}: {bytes}");
        }
        assert_eq!(next, sizes.len());
    }
}
