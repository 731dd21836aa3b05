//! Unit and property tests of the chunked decoder: whole bodies, every split of the input
//! into receives, and each refusal.

use proptest::prelude::*;

use super::*;

/// The body and the bytes after it, or the error, or `None` if the body never completed.
type Decoded = Result<Option<(Vec<u8>, Vec<u8>)>, ChunkError>;

const LIM: ChunkLimits = ChunkLimits {
    body_bytes_max: 64,
    line_bytes_max: 32,
};

/// Decodes `input` fed in pieces cut at `cuts` (as receives would deliver it): the body and
/// the bytes after it, or the error, or `None` if it never completed.
fn decode_split(input: &[u8], cuts: &[usize]) -> Decoded {
    let mut d = Decoder::new();
    let mut buf = Vec::new();
    let mut at = 0;
    let mut ends: Vec<usize> = cuts.iter().map(|&c| c.min(input.len())).collect();
    ends.push(input.len());
    ends.sort_unstable();
    for end in ends {
        if end < at {
            continue;
        }
        buf.extend_from_slice(&input[at..end]);
        at = end;
        match d.decode(&mut buf, &LIM)? {
            Progress::More { len } => buf.truncate(len),
            Progress::Done { body, rest } => {
                let mut after = buf[body..body + rest].to_vec();
                after.extend_from_slice(&input[at..]);
                return Ok(Some((buf[..body].to_vec(), after)));
            }
        }
    }
    Ok(None)
}

fn decode_all(input: &[u8]) -> Decoded {
    decode_split(input, &[])
}

fn done(body: &str, rest: &str) -> Decoded {
    Ok(Some((body.as_bytes().to_vec(), rest.as_bytes().to_vec())))
}

#[test]
fn chunks_join_into_the_body_and_the_next_request_stays_behind_it() {
    let input = b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n";
    assert_eq!(
        decode_all(input),
        done("hello world", "GET / HTTP/1.1\r\n\r\n")
    );
}

#[test]
fn hex_sizes_extensions_and_trailers() {
    let input = b"A ; name=\"v;x\" ;flag\r\n0123456789\r\n0\r\nX-Sum: 1\r\nX-B:\t2\r\n\r\n";
    assert_eq!(decode_all(input), done("0123456789", ""));
    assert_eq!(
        decode_all(b"00000a\r\n0123456789\r\n0\r\n\r\n"),
        done("0123456789", "")
    );
    assert_eq!(decode_all(b"0\r\n\r\n"), done("", ""));
}

#[test]
fn without_the_final_chunk_the_body_is_never_done() {
    assert_eq!(decode_all(b"5\r\nhello\r\n"), Ok(None));
    assert_eq!(decode_all(b"5\r\nhello\r\n0\r\n"), Ok(None));
    assert_eq!(decode_all(b"5\r\nhello\r\n0\r\nX-T: 1\r\n"), Ok(None));
}

#[test]
fn a_chunk_size_beyond_64_bits_is_refused() {
    assert_eq!(
        decode_all(b"10000000000000000\r\nx"),
        Err(ChunkError::SizeOverflow)
    );
    // Fits in 64 bits, but not in the body limit.
    assert_eq!(
        decode_all(b"ffffffffffffffff\r\nx"),
        Err(ChunkError::TooLarge { limit: 64 })
    );
    assert_eq!(
        decode_all(b"40\r\n"),
        Ok(None),
        "exactly the limit is allowed"
    );
    assert_eq!(
        decode_all(b"20\r\n0123456789abcdef0123456789abcdef\r\n21\r\n"),
        Err(ChunkError::TooLarge { limit: 64 })
    );
}

#[test]
fn sizes_are_bare_hex_digits() {
    for bad in [
        &b"-5\r\n"[..],
        b"+5\r\n",
        b"0x5\r\n",
        b" 5\r\n",
        b"5 \r\n",
        b"\r\n",
        b"5 x\r\n",
        b"g\r\n",
    ] {
        assert_eq!(decode_all(bad), Err(ChunkError::BadSize), "{bad:?}");
    }
    assert_eq!(decode_all(b"5;\x01\r\n"), Err(ChunkError::BadExtension));
}

#[test]
fn only_crlf_ends_a_line() {
    assert_eq!(decode_all(b"5\nhello\r\n"), Err(ChunkError::BadLineEnding));
    assert_eq!(decode_all(b"5\rhello\r\n"), Err(ChunkError::BadLineEnding));
    assert_eq!(decode_all(b"0\r\n\n"), Err(ChunkError::BadLineEnding));
    assert_eq!(
        decode_all(b"5\r\nhelloX\r\n"),
        Err(ChunkError::MissingDataEnd)
    );
    assert_eq!(
        decode_all(b"5\r\nhello\n0\r\n\r\n"),
        Err(ChunkError::MissingDataEnd)
    );
}

#[test]
fn trailers_are_fields_within_the_limit() {
    assert_eq!(
        decode_all(b"0\r\n folded\r\n\r\n"),
        Err(ChunkError::BadTrailer)
    );
    assert_eq!(
        decode_all(b"0\r\nno colon\r\n\r\n"),
        Err(ChunkError::BadTrailer)
    );
    assert_eq!(
        decode_all(b"0\r\n: empty name\r\n\r\n"),
        Err(ChunkError::BadTrailer)
    );
    let big = format!("0\r\nX-A: {}\r\n\r\n", "a".repeat(40));
    assert_eq!(
        decode_all(big.as_bytes()),
        Err(ChunkError::TrailersTooLarge)
    );
    let many = format!("0\r\n{}\r\n", "X: 1234567\r\n".repeat(3));
    assert_eq!(
        decode_all(many.as_bytes()),
        Err(ChunkError::TrailersTooLarge)
    );
}

#[test]
fn a_long_size_line_is_refused_before_it_ends() {
    let long = format!("5;{}", "e".repeat(40));
    assert_eq!(decode_all(long.as_bytes()), Err(ChunkError::LineTooLong));
}

#[test]
fn the_buffer_holds_the_body_and_at_most_one_incomplete_line() {
    let mut d = Decoder::new();
    let mut buf = b"5\r\nhel".to_vec();
    assert_eq!(d.decode(&mut buf, &LIM), Ok(Progress::More { len: 3 }));
    assert_eq!(&buf[..3], b"hel");
    buf.truncate(3);
    buf.extend_from_slice(b"lo\r\n1");
    assert_eq!(d.decode(&mut buf, &LIM), Ok(Progress::More { len: 6 }));
    assert_eq!(
        &buf[..6],
        b"hello1",
        "the body, then the start of a size line"
    );
    assert_eq!(d.body_len(), 5);
}

/// Encodes `body` in chunks of the given sizes (the last chunk takes the rest).
fn encode(body: &[u8], sizes: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    for &s in sizes.iter().chain(std::iter::once(&usize::MAX)) {
        let n = s.min(body.len() - at);
        if n > 0 {
            out.extend_from_slice(format!("{n:x};e=1\r\n").as_bytes());
            out.extend_from_slice(&body[at..at + n]);
            out.extend_from_slice(b"\r\n");
            at += n;
        }
        if at == body.len() {
            break;
        }
    }
    out.extend_from_slice(b"0\r\nT: x\r\n\r\n");
    out
}

proptest! {
    /// However the bytes are cut into receives, the decoder gives the same body and leaves
    /// the same bytes after it; and every error is the same error.
    #[test]
    fn any_split_gives_the_whole_decode(
        body in proptest::collection::vec(any::<u8>(), 0..64),
        sizes in proptest::collection::vec(1usize..20, 0..8),
        cuts in proptest::collection::vec(0usize..200, 0..12),
        garbage in proptest::collection::vec(any::<u8>(), 0..8),
        at in 0usize..200,
    ) {
        let mut input = encode(&body, &sizes);
        input.extend_from_slice(b"NEXT");
        prop_assert_eq!(decode_split(&input, &cuts), Ok(Some((body.clone(), b"NEXT".to_vec()))));
        // Garbage spliced in anywhere: the split never changes the verdict.
        let at = at.min(input.len());
        input.splice(at..at, garbage);
        prop_assert_eq!(decode_split(&input, &cuts), decode_all(&input));
    }
}
