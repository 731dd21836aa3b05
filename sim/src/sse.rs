//! The client's parser of what a subscription sends: an HTTP head, then SSE blocks. What it
//! yields is checked against the oracle; anything it cannot read is a violation.
#![forbid(unsafe_code)]

/// One thing the client read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// The answer's status; anything but 200 is an explicit error (the body follows).
    Head { status: u16 },
    /// An event: its `id:`, `event:` and the `data:` lines joined by `\n`.
    Event {
        id: String,
        event: Option<String>,
        data: Vec<u8>,
    },
    /// `event: truncated` (below the retained floor, or lagging): an explicit error; its
    /// data is the JSON that says which.
    Truncated { data: String },
    /// A comment, `retry:` or keep-alive.
    Other,
}

/// Bytes received so far, not yet parsed.
#[derive(Debug, Default)]
pub struct Parser {
    buf: Vec<u8>,
    head_done: bool,
    /// The answer's head, once read (status line and headers).
    pub head: String,
}

impl Parser {
    /// The value of header `name` in the head read, if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    pub fn feed(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// The next complete item, if any; `Err` for bytes that are not a valid answer.
    pub fn poll_item(&mut self) -> Result<Option<Item>, String> {
        if !self.head_done {
            let Some(end) = find(&self.buf, b"\r\n\r\n") else {
                return Ok(None);
            };
            let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
            self.buf.drain(..end + 4);
            self.head_done = true;
            self.head.clone_from(&head);
            let status = head
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("bad status line in {head:?}"))?;
            return Ok(Some(Item::Head { status }));
        }
        let Some(end) = find(&self.buf, b"\n\n") else {
            return Ok(None);
        };
        let block: Vec<u8> = self.buf.drain(..end + 2).collect();
        parse_block(&block[..end]).map(Some)
    }
}

/// One SSE block (without its blank line).
pub fn parse_block(block: &[u8]) -> Result<Item, String> {
    let text = std::str::from_utf8(block).map_err(|e| format!("block not UTF-8: {e}"))?;
    let (mut id, mut event, mut data) = (None, None, None::<Vec<u8>>);
    for line in text.split('\n') {
        if line.starts_with(':') || line.starts_with("retry:") {
            continue;
        } else if let Some(v) = line.strip_prefix("id: ") {
            id = Some(v.to_owned());
        } else if let Some(v) = line.strip_prefix("event: ") {
            event = Some(v.to_owned());
        } else if let Some(v) = line.strip_prefix("data: ") {
            match &mut data {
                Some(d) => {
                    d.push(b'\n');
                    d.extend_from_slice(v.as_bytes());
                }
                None => data = Some(v.as_bytes().to_vec()),
            }
        } else {
            return Err(format!("unexpected SSE line {line:?}"));
        }
    }
    match (id, event.as_deref()) {
        (None, Some("truncated")) => Ok(Item::Truncated {
            data: String::from_utf8_lossy(&data.unwrap_or_default()).into_owned(),
        }),
        (None, _) => Ok(Item::Other),
        (Some(id), _) => Ok(Item::Event {
            id,
            event,
            data: data.unwrap_or_default(),
        }),
    }
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}
