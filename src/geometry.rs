//! Unified KV pool geometry (docs/pool.md §2): which rows of a layer's buffer
//! hold which request's sliding-window ring, and where compressed rows start.

use crate::error::{ensure, err, Error, Result};

/// Latent row width: 448 "nope" dims followed by 64 RoPE dims.
pub const HEAD_DIM: usize = 512;
/// Tokens per page of the caller's page tables (sglang hard-codes 256).
pub const PAGE_TOKENS: usize = 256;
/// Raw tokens per compression block (lcm of the two ratios).
pub const BLOCK_TOKENS: usize = 128;

/// Compression ratio of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ratio {
    /// Dense sliding-window layer: no compressed rows.
    Dense,
    /// CSA: one compressed row per 4 tokens, selected by the indexer's top-k.
    Csa,
    /// HCA: one compressed row per 128 tokens, all attended.
    Hca,
}

impl Ratio {
    pub fn from_raw(arg: &str, raw: u32) -> Result<Self> {
        match raw {
            0 => Ok(Ratio::Dense),
            4 => Ok(Ratio::Csa),
            128 => Ok(Ratio::Hca),
            _ => Err(err!(
                BadEnum,
                "{arg}: compress ratio {raw}, expected 0, 4 or 128"
            )),
        }
    }

    pub fn value(self) -> usize {
        match self {
            Ratio::Dense => 0,
            Ratio::Csa => 4,
            Ratio::Hca => 128,
        }
    }

    /// Compressed rows per 128-token block.
    pub fn rows_per_block(self) -> usize {
        match self {
            Ratio::Dense => 0,
            Ratio::Csa => BLOCK_TOKENS / 4,
            Ratio::Hca => 1,
        }
    }

    /// The extra page of compressed rows (token locations run 1..size).
    pub fn padding_rows(self) -> usize {
        match self {
            Ratio::Dense => 0,
            r => PAGE_TOKENS / r.value(),
        }
    }

    /// Compressed groups a token at `pos` can see: groups closed at or before it.
    pub fn visible_groups(self, pos: usize) -> usize {
        match self {
            Ratio::Dense => 0,
            r => (pos + 1) / r.value(),
        }
    }
}

/// Ring sizes a ratio-4 state may have: 8 rows, or 16 for speculative decoding.
pub const C4_RINGS: [usize; 2] = [8, 16];
/// Ring sizes a ratio-128 state may have: 128 rows, or 256 for speculative decoding.
pub const C128_RINGS: [usize; 2] = [128, 256];
/// Ring sizes of a pool's compressor state, as the caller chose them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateRings {
    /// Rows per slot of every ratio-4 state (8 or 16).
    pub c4: usize,
    /// Rows per slot of every ratio-128 state (128 or 256).
    pub c128: usize,
}

impl StateRings {
    /// Checks the ring sizes for a pool whose layers have `ratios`: a ring is
    /// required (and must be one of the allowed sizes) when a layer of its
    /// ratio exists; otherwise it must be 0 or an allowed size.
    pub fn check(self, ratios: &[Ratio]) -> Result<Self> {
        for (name, ring, allowed, ratio) in [
            ("params.c4_state_ring", self.c4, C4_RINGS, Ratio::Csa),
            ("params.c128_state_ring", self.c128, C128_RINGS, Ratio::Hca),
        ] {
            let needed = ratios.contains(&ratio);
            ensure!(
                allowed.contains(&ring) || (ring == 0 && !needed),
                InvalidArgument,
                "{name}: {ring} rows, expected {} or {} (the second for speculative decoding){}",
                allowed[0],
                allowed[1],
                if needed {
                    format!(" for the pool's ratio-{} layers", ratio.value())
                } else {
                    ", or 0 (the pool has no layer of that ratio)".into()
                }
            );
        }
        Ok(self)
    }

    pub fn ring(self, ratio: Ratio) -> usize {
        match ratio {
            Ratio::Dense => 0,
            Ratio::Csa => self.c4,
            Ratio::Hca => self.c128,
        }
    }
}

/// Everything needed to size a pool, as given by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    pub ratios: Vec<Ratio>,
    pub max_requests: usize,
    pub window: usize,
    pub spec_extra: usize,
    pub c128_blocks: usize,
    /// Compressor state (docs/compressor.md §3): its ring sizes, or None for
    /// a pool without it.
    pub state: Option<StateRings>,
}

/// Derived pool geometry. Row counts are per layer; all offsets fit in 64 bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub config: PoolConfig,
    /// Rows of one request's SWA ring: window + speculative extra.
    pub ring: usize,
    /// Request slots including the reserved slot 0.
    pub num_slots: usize,
    /// Rows of the SWA region, identical in every layer.
    pub swa_rows: usize,
}

impl Geometry {
    pub fn new(config: PoolConfig) -> Result<Self> {
        ensure!(
            !config.ratios.is_empty(),
            InvalidArgument,
            "params.num_layers: must be at least 1"
        );
        ensure!(
            config.max_requests >= 1,
            InvalidArgument,
            "params.max_requests: must be at least 1"
        );
        ensure!(
            config.window >= 1,
            InvalidArgument,
            "params.window: must be at least 1"
        );
        let ring = config
            .window
            .checked_add(config.spec_extra)
            .ok_or_else(|| {
                err!(
                    InvalidArgument,
                    "params.spec_extra: window + spec_extra overflows"
                )
            })?;
        let num_slots = config.max_requests + 1;
        let swa_rows = num_slots
            .checked_mul(ring)
            .ok_or_else(|| too_big("params.max_requests"))?;
        if let Some(rings) = config.state {
            rings.check(&config.ratios)?;
        }
        let geometry = Geometry {
            config,
            ring,
            num_slots,
            swa_rows,
        };
        for layer in 0..geometry.num_layers() {
            let ratio = geometry.config.ratios[layer];
            let rows = geometry
                .compressed_rows_checked(ratio)
                .and_then(|c| c.checked_add(geometry.swa_rows))
                .and_then(|r| r.checked_mul(HEAD_DIM * 2))
                .filter(|bytes| *bytes <= isize::MAX as usize);
            ensure!(
                rows.is_some(),
                InvalidArgument,
                "{}: layer {layer} would exceed the address space",
                geometry.size_culprit(isize::MAX as usize / (HEAD_DIM * 2))
            );
        }
        Ok(geometry)
    }

    /// The parameter to name when a layer has more rows than `limit`: the
    /// SWA region's larger factor when that region alone passes the limit,
    /// else the compressed rows on top of it.
    pub fn size_culprit(&self, limit: usize) -> &'static str {
        if self.swa_rows <= limit {
            "params.c128_blocks"
        } else if self.ring > self.num_slots {
            if self.config.spec_extra > self.config.window {
                "params.spec_extra"
            } else {
                "params.window"
            }
        } else {
            "params.max_requests"
        }
    }

    fn compressed_rows_checked(&self, ratio: Ratio) -> Option<usize> {
        self.config
            .c128_blocks
            .checked_mul(ratio.rows_per_block())?
            .checked_add(ratio.padding_rows())
    }

    pub fn num_layers(&self) -> usize {
        self.config.ratios.len()
    }

    pub fn ratio(&self, layer: usize) -> Ratio {
        self.config.ratios[layer]
    }

    /// Compressed rows of a layer with the given ratio (0 for dense layers).
    pub fn compressed_rows(&self, ratio: Ratio) -> usize {
        self.config.c128_blocks * ratio.rows_per_block() + ratio.padding_rows()
    }

    /// Total rows of one layer's buffer.
    pub fn rows(&self, layer: usize) -> usize {
        self.swa_rows + self.compressed_rows(self.ratio(layer))
    }

    /// Ring row of request slot `slot` at absolute position `pos`.
    pub fn swa_row(&self, slot: usize, pos: usize) -> usize {
        slot * self.ring + pos % self.ring
    }

    /// Pool row of compressed page index `page_index`.
    pub fn compressed_row(&self, page_index: usize) -> usize {
        self.swa_rows + page_index
    }

    /// Index streams hold int32 row ids: fails when the rows a builder may
    /// address for `ratio` pass 2^31 - 1. Pool creation checks this only for
    /// the ratios its layers have, so a pool without ratio-4 layers may have
    /// more CSA rows than that.
    pub fn check_row_ids(&self, ratio: Ratio) -> Result<()> {
        let rows = self
            .compressed_rows_checked(ratio)
            .and_then(|c| c.checked_add(self.swa_rows));
        ensure!(
            rows.is_some_and(|r| r <= i32::MAX as usize),
            InvalidArgument,
            "pool: its ratio-{} row ids would pass 2^31 - 1 (params.c128_blocks = {})",
            ratio.value(),
            self.config.c128_blocks
        );
        Ok(())
    }

    pub fn check_layer(&self, layer: u32) -> Result<usize> {
        let layer = layer as usize;
        ensure!(
            layer < self.num_layers(),
            OutOfRange,
            "layer: {layer} is out of range, the pool has {} layers",
            self.num_layers()
        );
        Ok(layer)
    }
}

fn too_big(arg: &str) -> Error {
    err!(
        InvalidArgument,
        "{arg}: the pool would exceed the address space"
    )
}
