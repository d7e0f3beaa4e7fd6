//! The byte cursor every decision of the harness reads from. An exhausted
//! cursor returns zeros, and every decision maps 0 to its honest choice, so a
//! short input still decodes to a sequence of valid calls.

pub struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Cursor { data, pos: 0 }
    }

    pub fn exhausted(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        (self.u32() as u64) | ((self.u32() as u64) << 32)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            self.u8();
            return 0;
        }
        if n <= 256 {
            self.u8() as usize % n
        } else {
            self.u16() as usize % n
        }
    }

    /// A value in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability about `n / 256`; false on an exhausted cursor.
    pub fn chance(&mut self, n: u8) -> bool {
        let b = self.u8();
        b != 0 && b <= n
    }

    /// An element of `items` (the first on an exhausted cursor).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// A small float in [-4, 4) with a few interesting values mixed in.
    pub fn small_f32(&mut self) -> f32 {
        let b = self.u8();
        match b {
            0 => 0.0,
            255 => -0.0,
            254 => 1e-30,
            253 => 3000.0,
            _ => ((b as i8) as f32) / 32.0,
        }
    }
}
