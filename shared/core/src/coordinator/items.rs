//! A fan-out's items held in an object, read page by page: never the whole object in memory, except a
//! claim-checked input (a JSON document whose `items` array is read whole, at most its reference's
//! size).
//!
//! `itemsFrom` names an object of the payload bucket under `payloads/`, in JSON lines (one item per
//! line) or CSV (a header line, then one item per row, an object of the header's fields, values as
//! text; fields may be quoted, with `""` for a quote):
//! `{"itemsFrom": {"bucket": "...", "key": "payloads/...", "format": "jsonl" | "csv"}}`. Empty lines
//! are skipped. The object must not change while the fan-out runs: it is read twice (to count the
//! items, then to start the children).

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::claims::{ClaimCheck, ClaimError};
use crate::domain::payload::PayloadRef;
use crate::domain::{Code, Payload, StepError};

/// Bytes read per ranged GET.
pub const PAGE_BYTES: u64 = 1024 * 1024;
/// Items of a claim-checked input handed out per page.
const PAGE_ITEMS: usize = 1000;

/// Where a fan-out's items are.
#[derive(Debug, Clone, PartialEq)]
pub enum ItemSource {
    /// An object of lines, read in pages.
    Lines(ItemsFrom),
    /// A claim-checked input: its `items` array.
    Reference(PayloadRef),
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ItemsFrom {
    pub bucket: String,
    pub key: String,
    #[serde(default)]
    pub format: Format,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    #[default]
    Jsonl,
    Csv,
}

/// Why items cannot be read: final (`INVALID_ITEMS`, an unresolvable object) or not (the bucket
/// unavailable).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ItemsError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Claim(#[from] ClaimError),
}

impl ItemsError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, ItemsError::Claim(e) if e.is_retryable())
    }

    /// As the failure of the fan-out step.
    pub fn step_error(&self) -> StepError {
        match self {
            ItemsError::Invalid(message) => {
                StepError::new(Code::InvalidItems.as_str(), message.clone(), false)
            }
            ItemsError::Claim(e) => e.step_error(),
        }
    }
}

impl ItemSource {
    /// The source of a fan-out step's input holding its items in an object (`None`: inline).
    pub fn of(input: &Payload) -> Result<Option<ItemSource>, ItemsError> {
        if let Some(reference) = input.reference() {
            return Ok(Some(ItemSource::Reference(reference)));
        }
        match input.value().get("itemsFrom") {
            None => Ok(None),
            Some(from) => serde_json::from_value(from.clone())
                .map(|from| Some(ItemSource::Lines(from)))
                .map_err(|e| ItemsError::Invalid(format!("itemsFrom: {e}"))),
        }
    }
}

/// Reads a source's items, a page at a time.
pub struct ItemReader<'a> {
    claims: &'a ClaimCheck,
    source: ItemSource,
    /// Next byte of the object to read.
    offset: u64,
    /// The start of a line the last page cut off.
    carry: Vec<u8>,
    /// Lines read so far (for error messages).
    line: u64,
    header: Option<Vec<String>>,
    /// A claim-checked input's items not handed out yet.
    whole: Option<std::vec::IntoIter<Value>>,
    done: bool,
}

impl<'a> ItemReader<'a> {
    pub fn new(claims: &'a ClaimCheck, source: ItemSource) -> Self {
        Self {
            claims,
            source,
            offset: 0,
            carry: Vec::new(),
            line: 0,
            header: None,
            whole: None,
            done: false,
        }
    }

    /// Counts the items (reading every page once).
    pub async fn count(mut self) -> Result<u32, ItemsError> {
        let mut count = 0u64;
        while let Some(page) = self.next_page().await? {
            count += page.len() as u64;
        }
        u32::try_from(count).map_err(|_| ItemsError::Invalid(format!("{count} items are too many")))
    }

    /// The next items in order; `None` after the last.
    pub async fn next_page(&mut self) -> Result<Option<Vec<Value>>, ItemsError> {
        loop {
            if self.done {
                return Ok(None);
            }
            let page = match self.source.clone() {
                ItemSource::Reference(reference) => self.next_of_reference(&reference).await?,
                ItemSource::Lines(from) => self.next_of_lines(&from).await?,
            };
            // A page of blank lines only: read on.
            if !page.is_empty() || self.done {
                return Ok((!page.is_empty()).then_some(page));
            }
        }
    }

    async fn next_of_reference(
        &mut self,
        reference: &PayloadRef,
    ) -> Result<Vec<Value>, ItemsError> {
        if self.whole.is_none() {
            let bytes = self.claims.fetch(reference).await?;
            let mut document: Value = serde_json::from_slice(&bytes)
                .map_err(|e| ItemsError::Invalid(format!("{} is not JSON: {e}", reference.key)))?;
            let items = match document.get_mut("items").map(Value::take) {
                Some(Value::Array(items)) => items,
                _ => {
                    return Err(ItemsError::Invalid(
                        "a fan-out step's input needs an `items` array".into(),
                    ))
                }
            };
            self.whole = Some(items.into_iter());
        }
        let whole = self.whole.as_mut().expect("set above");
        let page: Vec<Value> = whole.by_ref().take(PAGE_ITEMS).collect();
        if whole.len() == 0 {
            self.done = true;
        }
        Ok(page)
    }

    async fn next_of_lines(&mut self, from: &ItemsFrom) -> Result<Vec<Value>, ItemsError> {
        let bytes = self
            .claims
            .fetch_range(&from.bucket, &from.key, self.offset, PAGE_BYTES)
            .await?;
        self.offset += bytes.len() as u64;
        let last = (bytes.len() as u64) < PAGE_BYTES;
        let mut text = std::mem::take(&mut self.carry);
        text.extend_from_slice(&bytes);
        // The last line of a full page may go on in the next one.
        let complete = match (last, text.iter().rposition(|b| *b == b'\n')) {
            (true, _) => text.len(),
            (false, Some(end)) => end + 1,
            (false, None) => 0,
        };
        self.carry = text.split_off(complete);
        self.done = last;
        let mut items = Vec::new();
        for raw in text.split(|b| *b == b'\n') {
            self.line += 1;
            let line = std::str::from_utf8(raw)
                .map_err(|_| self.invalid(from, "is not UTF-8"))?
                .trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            match from.format {
                Format::Jsonl => items.push(
                    serde_json::from_str(line)
                        .map_err(|e| self.invalid(from, &format!("is not JSON: {e}")))?,
                ),
                Format::Csv => {
                    let fields = csv_fields(line)
                        .ok_or_else(|| self.invalid(from, "has an unterminated quote"))?;
                    match &self.header {
                        None => self.header = Some(fields),
                        Some(header) if header.len() != fields.len() => {
                            let message =
                                format!("has {} fields, the header {}", fields.len(), header.len());
                            return Err(self.invalid(from, &message));
                        }
                        Some(header) => items.push(Value::Object(
                            header
                                .iter()
                                .cloned()
                                .zip(fields.into_iter().map(Value::String))
                                .collect::<Map<String, Value>>(),
                        )),
                    }
                }
            }
        }
        // The split above counts a line after a final newline: not a line of the object.
        if text.last() == Some(&b'\n') {
            self.line -= 1;
        }
        Ok(items)
    }

    fn invalid(&self, from: &ItemsFrom, what: &str) -> ItemsError {
        ItemsError::Invalid(format!("line {} of {} {what}", self.line, from.key))
    }
}

/// The fields of a CSV line: comma-separated, a field in double quotes may hold commas and `""` for a
/// quote. `None` for an unterminated quote.
fn csv_fields(line: &str) -> Option<Vec<String>> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (false, '"') if field.is_empty() => quoted = true,
            (false, ',') => fields.push(std::mem::take(&mut field).trim().to_string()),
            (_, c) => field.push(c),
        }
    }
    if quoted {
        return None;
    }
    fields.push(field.trim().to_string());
    Some(fields)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::adapters::InMemoryPayloadStore;
    use crate::ports::PayloadStore;

    fn claims(store: &Arc<InMemoryPayloadStore>) -> ClaimCheck {
        ClaimCheck::new(store.clone(), "bucket", 1024)
    }

    async fn all(claims: &ClaimCheck, source: ItemSource) -> Result<Vec<Value>, ItemsError> {
        let mut reader = ItemReader::new(claims, source);
        let mut items = Vec::new();
        while let Some(page) = reader.next_page().await? {
            items.extend(page);
        }
        Ok(items)
    }

    fn lines(key: &str, format: Format) -> ItemSource {
        ItemSource::Lines(ItemsFrom {
            bucket: "bucket".into(),
            key: key.into(),
            format,
        })
    }

    #[tokio::test]
    async fn json_lines_are_read_in_pages_with_lines_cut_between_pages() {
        let store = Arc::new(InMemoryPayloadStore::default());
        // About 2.5 pages, so lines straddle page ends.
        let count = 50_000;
        let text: String = (0..count)
            .map(|i| format!("{{\"row\":{i},\"pad\":\"{}\"}}\n", "x".repeat(40)))
            .collect();
        assert!(text.len() as u64 > 2 * PAGE_BYTES);
        store
            .put("bucket", "payloads/rows.jsonl", text.into_bytes())
            .await
            .unwrap();
        let claims = claims(&store);
        let source = lines("payloads/rows.jsonl", Format::Jsonl);
        let items = all(&claims, source.clone()).await.unwrap();
        assert_eq!(items.len(), count);
        assert!(items.iter().enumerate().all(|(i, item)| item["row"] == i));
        assert_eq!(
            ItemReader::new(&claims, source).count().await.unwrap(),
            count as u32
        );
    }

    #[tokio::test]
    async fn csv_rows_become_objects_of_the_header_fields() {
        let store = Arc::new(InMemoryPayloadStore::default());
        let text =
            "payee,iban,amount_cents\r\nAda,GB33,12500\n\n\"Hopper, Grace\",\"DE\"\"89\",500";
        store
            .put("bucket", "payloads/rows.csv", text.into())
            .await
            .unwrap();
        let items = all(&claims(&store), lines("payloads/rows.csv", Format::Csv))
            .await
            .unwrap();
        assert_eq!(
            items,
            vec![
                json!({"payee": "Ada", "iban": "GB33", "amount_cents": "12500"}),
                json!({"payee": "Hopper, Grace", "iban": "DE\"89", "amount_cents": "500"}),
            ]
        );
    }

    #[tokio::test]
    async fn unreadable_items_are_a_final_invalid_items_error() {
        let store = Arc::new(InMemoryPayloadStore::default());
        store
            .put(
                "bucket",
                "payloads/bad.jsonl",
                b"{\"a\":1}\nnot json\n".to_vec(),
            )
            .await
            .unwrap();
        store
            .put("bucket", "payloads/bad.csv", b"a,b\n1,2,3\n".to_vec())
            .await
            .unwrap();
        let claims = claims(&store);
        for (key, format, says) in [
            (
                "payloads/bad.jsonl",
                Format::Jsonl,
                "line 2 of payloads/bad.jsonl is not JSON",
            ),
            (
                "payloads/bad.csv",
                Format::Csv,
                "line 2 of payloads/bad.csv has 3 fields, the header 2",
            ),
        ] {
            let error = all(&claims, lines(key, format)).await.unwrap_err();
            assert!(!error.is_retryable());
            assert_eq!(error.step_error().code, "INVALID_ITEMS");
            assert!(error.to_string().starts_with(says), "{error}");
        }
        // Another bucket, or outside the payload prefix, is never read.
        for (bucket, key) in [("elsewhere", "payloads/bad.jsonl"), ("bucket", "secrets/x")] {
            let source = ItemSource::Lines(ItemsFrom {
                bucket: bucket.into(),
                key: key.into(),
                format: Format::Jsonl,
            });
            let error = all(&claims, source).await.unwrap_err();
            assert_eq!(error.step_error().code, "PAYLOAD_UNRESOLVABLE");
        }
    }

    #[tokio::test]
    async fn a_claim_checked_input_hands_out_its_items_array() {
        let store = Arc::new(InMemoryPayloadStore::default());
        let claims = claims(&store);
        let items: Vec<Value> = (0..2500).map(|i| json!({"row": i})).collect();
        let input = claims
            .offload(
                uuid::Uuid::from_u128(1),
                json!({"items": items, "badRows": []}),
            )
            .await
            .unwrap();
        let source = ItemSource::of(&Payload::new(input))
            .unwrap()
            .expect("a reference");
        assert_eq!(all(&claims, source.clone()).await.unwrap(), items);
        assert_eq!(
            ItemReader::new(&claims, source).count().await.unwrap(),
            2500
        );
    }
}
