//! Motion-JPEG in an AVI container: the recorder's file format ([`crate::record`]). The
//! frames Chromium's screencast sends are JPEGs already, so a video needs no encoder, only
//! this container (RIFF `AVI ` with one `MJPG` stream and an `idx1` index), which ffmpeg,
//! VLC and mpv play and convert.

/// `AVIF_HASINDEX` in `avih`, `AVIIF_KEYFRAME` in `idx1`: every MJPEG frame stands alone.
const HAS_INDEX: u32 = 0x10;
const KEYFRAME: u32 = 0x10;

/// The pixel size a JPEG declares in its start-of-frame segment.
pub fn jpeg_size(jpeg: &[u8]) -> Option<(u32, u32)> {
    if !jpeg.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut at = 2;
    while at + 4 <= jpeg.len() {
        if jpeg[at] != 0xFF {
            return None;
        }
        let marker = jpeg[at + 1];
        let length = u16::from_be_bytes([jpeg[at + 2], jpeg[at + 3]]) as usize;
        // SOF0..SOF15, except DHT (C4), JPG (C8) and DAC (CC), which share the range.
        if (0xC0..=0xCF).contains(&marker) && ![0xC4, 0xC8, 0xCC].contains(&marker) {
            let sof = jpeg.get(at + 5..at + 9)?;
            let height = u16::from_be_bytes([sof[0], sof[1]]) as u32;
            let width = u16::from_be_bytes([sof[2], sof[3]]) as u32;
            return Some((width, height));
        }
        at += 2 + length;
    }
    None
}

fn chunk(out: &mut Vec<u8>, id: &[u8; 4], body: &[u8]) {
    out.extend_from_slice(id);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    if body.len() % 2 == 1 {
        out.push(0);
    }
}

fn list(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 12);
    let mut inner = kind.to_vec();
    inner.extend_from_slice(body);
    chunk(&mut out, b"LIST", &inner);
    out
}

fn words(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The AVI file of `frames` (JPEGs of `width` x `height`) shown at `fps`.
pub fn mjpeg(frames: &[&[u8]], fps: u32, width: u32, height: u32) -> Vec<u8> {
    let count = frames.len() as u32;
    let largest = frames.iter().map(|f| f.len()).max().unwrap_or(0) as u32;
    let avih = words(&[
        1_000_000 / fps.max(1),
        largest.saturating_mul(fps),
        0,
        HAS_INDEX,
        count,
        0,
        1,
        largest,
        width,
        height,
        0,
        0,
        0,
        0,
    ]);
    let mut strh = b"vidsMJPG".to_vec();
    strh.extend(words(&[0, 0, 0, 1, fps, 0, count, largest, u32::MAX, 0]));
    for edge in [0u16, 0, width as u16, height as u16] {
        strh.extend_from_slice(&edge.to_le_bytes());
    }
    let mut strf = words(&[40, width, height]);
    strf.extend_from_slice(&1u16.to_le_bytes());
    strf.extend_from_slice(&24u16.to_le_bytes());
    strf.extend_from_slice(b"MJPG");
    strf.extend(words(&[width * height * 3, 0, 0, 0, 0]));

    let mut stream = Vec::new();
    chunk(&mut stream, b"strh", &strh);
    chunk(&mut stream, b"strf", &strf);
    let mut header = Vec::new();
    chunk(&mut header, b"avih", &avih);
    header.extend(list(b"strl", &stream));

    // `idx1` offsets count from the `movi` list's type field, as the AVI spec has them.
    let mut movi = Vec::new();
    let mut index = Vec::with_capacity(frames.len() * 16);
    for frame in frames {
        index.extend_from_slice(b"00dc");
        index.extend(words(&[
            KEYFRAME,
            movi.len() as u32 + 4,
            frame.len() as u32,
        ]));
        chunk(&mut movi, b"00dc", frame);
    }

    let mut body = b"AVI ".to_vec();
    body.extend(list(b"hdrl", &header));
    body.extend(list(b"movi", &movi));
    chunk(&mut body, b"idx1", &index);
    let mut out = Vec::with_capacity(body.len() + 8);
    chunk(&mut out, b"RIFF", &body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JPEG's start and its SOF0 segment: enough for `jpeg_size`.
    fn fake_jpeg(width: u16, height: u16, tail: usize) -> Vec<u8> {
        let mut j = vec![
            0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0, 0, 0xFF, 0xC0, 0x00, 0x11, 8,
        ];
        j.extend_from_slice(&height.to_be_bytes());
        j.extend_from_slice(&width.to_be_bytes());
        j.extend(vec![7; tail]);
        j
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn reads_the_size_from_the_frame_header() {
        assert_eq!(jpeg_size(&fake_jpeg(1280, 720, 3)), Some((1280, 720)));
        assert_eq!(jpeg_size(b"\x89PNG"), None);
        assert_eq!(jpeg_size(&[0xFF, 0xD8, 0xFF]), None);
    }

    #[test]
    fn the_index_points_at_every_frame() {
        let a = fake_jpeg(4, 2, 5);
        let b = fake_jpeg(4, 2, 6);
        let avi = mjpeg(&[&a, &b, &a], 15, 4, 2);
        assert_eq!(&avi[..4], b"RIFF");
        assert_eq!(u32_at(&avi, 4) as usize, avi.len() - 8);
        assert_eq!(&avi[8..12], b"AVI ");
        // avih: frames and size.
        let avih = avi.windows(4).position(|w| w == b"avih").unwrap() + 8;
        assert_eq!(u32_at(&avi, avih), 1_000_000 / 15);
        assert_eq!(u32_at(&avi, avih + 16), 3);
        assert_eq!((u32_at(&avi, avih + 32), u32_at(&avi, avih + 36)), (4, 2));
        let movi = avi.windows(4).position(|w| w == b"movi").unwrap();
        let idx1 = avi.windows(4).position(|w| w == b"idx1").unwrap();
        assert_eq!(u32_at(&avi, idx1 + 4), 3 * 16);
        for (n, frame) in [&a, &b, &a].iter().enumerate() {
            let entry = idx1 + 8 + n * 16;
            let at = movi + u32_at(&avi, entry + 8) as usize;
            assert_eq!(&avi[at..at + 4], b"00dc");
            assert_eq!(u32_at(&avi, at + 4) as usize, frame.len());
            assert_eq!(&avi[at + 8..at + 8 + frame.len()], frame.as_slice());
        }
    }
}
