//! The kernel params structs (kernels/params.h) against their Rust mirrors
//! (src/backend/gpu/shim.rs), field by field: the same fields, each at the
//! same offset and of the same size as the kernels' compiler lays it out
//! (kernels/devtools/param_layout.cu). The backend's start-up check compares
//! whole sizes only, which two swapped fields of one size pass. Host code
//! only: runs without a GPU.
#![cfg(all(any(feature = "cuda", feature = "rocm"), feature = "devtools"))]

use std::collections::{BTreeMap, BTreeSet};
use std::mem::{offset_of, size_of};

use unikv::backend::gpu::devtools::params::*;
use unikv::backend::gpu::devtools::{param_layout, ParamField};

/// The size of the field `field` reads.
fn field_size<T, F>(_field: impl Fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// A mirror's layout: (C name, size, [(field, offset, size)]). The pattern
/// names every field without `..`, so a field of the mirror left out of the
/// list fails to compile.
macro_rules! mirror {
    ($c:literal, $ty:ident { $($f:ident),* $(,)? }) => {{
        let _every_field_listed = |v: $ty| {
            let $ty { $($f: _),* } = v;
        };
        (
            $c,
            size_of::<$ty>(),
            vec![$((stringify!($f), offset_of!($ty, $f), field_size(|v: &$ty| &v.$f))),*],
        )
    }};
}

type Layout = (&'static str, usize, Vec<(&'static str, usize, usize)>);

fn rust_layouts() -> Vec<Layout> {
    vec![
        mirror!(
            "ukv_pool_rows",
            PoolRows {
                data,
                rope,
                fp8,
                fp8_format
            }
        ),
        mirror!(
            "ukv_store_swa_params",
            StoreSwaParams {
                kv,
                batch_id,
                req_slots,
                positions,
                final_pos,
                pool,
                kv_stride,
                pool_rows,
                num_tokens,
                num_requests,
                window,
                ring,
                num_slots,
                reserved
            }
        ),
        mirror!(
            "ukv_store_compressed_params",
            StoreCompressedParams {
                kv,
                loc,
                pool,
                kv_stride,
                swa_rows,
                compressed_rows,
                num_rows,
                reserved
            }
        ),
        mirror!(
            "ukv_cache_store_params",
            CacheStoreParams {
                rows,
                loc,
                cache,
                row_stride,
                bytes_per_page,
                token_slots,
                num_tokens,
                page_shift,
                format,
                loc_i64,
                rows_f32
            }
        ),
        mirror!(
            "ukv_scaled_store_params",
            ScaledStoreParams {
                rows,
                loc,
                codes,
                scales,
                row_stride,
                codes_stride,
                scales_stride,
                num_rows,
                num_tokens,
                divisor,
                format,
                loc_i64,
                reserved
            }
        ),
        mirror!(
            "ukv_prepare_qkv_params",
            PrepareQkvParams {
                q_in,
                q_out,
                kv_in,
                kv_weight,
                kv_out,
                rope_table,
                positions,
                rows,
                pool,
                q_in_stride_token,
                q_in_stride_head,
                q_out_stride_token,
                q_out_stride_head,
                kv_in_stride,
                kv_out_stride,
                table_stride,
                max_pos,
                pool_rows,
                num_tokens,
                num_heads,
                q_eps,
                kv_eps,
                positions_i64,
                rows_i64
            }
        ),
        mirror!(
            "ukv_stream_out",
            StreamOut {
                indptr,
                indices,
                capacity
            }
        ),
        mirror!(
            "ukv_decode_streams_params",
            DecodeStreamsParams {
                batch_id,
                req_slots,
                positions,
                c128,
                swa,
                hca,
                csa,
                c128_stride,
                c128_width,
                num_tokens,
                num_requests,
                window,
                ring,
                num_slots,
                swa_rows,
                hca_rows,
                csa_topk,
                reserved
            }
        ),
        mirror!(
            "ukv_csa_tail_params",
            CsaTailParams {
                batch_id,
                positions,
                table,
                indptr,
                indices,
                table_stride,
                capacity,
                width,
                num_tokens,
                window,
                swa_rows,
                csa_rows,
                reserved
            }
        ),
        mirror!(
            "ukv_prefill_streams_params",
            PrefillStreamsParams {
                batch_id,
                req_slots,
                positions,
                chunk_start,
                extend_start,
                table,
                prefix,
                extend,
                table_stride,
                width,
                ratio,
                num_tokens,
                num_requests,
                window,
                ring,
                num_slots,
                swa_rows,
                compressed_rows,
                reserved
            }
        ),
        mirror!(
            "ukv_kv_source",
            KvSource {
                kv,
                indices,
                indptr,
                kv_stride,
                rows,
                capacity,
                scales,
                scales_stride,
                layout,
                page_shift
            }
        ),
        mirror!(
            "ukv_attention_params",
            AttentionParams {
                q,
                out,
                lse,
                sink,
                workspace,
                src,
                q_stride_token,
                q_stride_head,
                out_stride_token,
                out_stride_head,
                lse_stride_token,
                workspace_bytes,
                num_sources,
                num_tokens,
                num_heads,
                skip_negative,
                softmax_scale,
                reserved,
                rope_table,
                positions,
                rope_rows,
                positions_i64,
                reserved2
            }
        ),
        mirror!(
            "ukv_merge_params",
            MergeParams {
                parts_out,
                parts_lse,
                sink,
                out,
                lse,
                part_stride_out,
                part_stride_lse,
                out_stride_token,
                out_stride_head,
                in_stride_token,
                in_stride_head,
                lse_stride_token,
                in_lse_stride_token,
                num_parts,
                num_tokens,
                num_heads,
                reserved
            }
        ),
        mirror!(
            "ukv_inverse_rope_params",
            InverseRopeParams {
                x,
                positions,
                table,
                x_stride_token,
                x_stride_head,
                table_stride,
                max_pos,
                num_tokens,
                num_heads,
                positions_i64,
                reserved
            }
        ),
        mirror!(
            "ukv_attention_plan",
            AttentionPlan {
                max_tokens,
                num_heads,
                head_blocks,
                block_m_tiles,
                sm_count,
                max_splits,
                workspace_bytes,
                dependent_launch,
                stages,
                wgmma,
                cluster,
                kv_fp8,
                portable,
                pair,
                long_splits,
                long_keys,
                reserved
            }
        ),
        mirror!(
            "ukv_fp8_check_params",
            Fp8CheckParams {
                x,
                sw,
                hw,
                scale,
                decoded,
                n,
                format,
                reserved
            }
        ),
        mirror!(
            "ukv_hash_topk_params",
            HashTopkParams {
                logits,
                input_ids,
                tid2eid,
                weights,
                ids,
                num_real,
                logits_stride,
                table_stride,
                weights_stride,
                ids_stride,
                vocab,
                num_tokens,
                num_experts,
                routed,
                shared,
                num_real_host,
                input_ids_i64,
                num_real_i64,
                routed_scaling_factor
            }
        ),
        mirror!(
            "ukv_indexer_q_params",
            IndexerQParams {
                q,
                weights,
                table,
                positions,
                q_fp8,
                weights_out,
                q_stride_token,
                q_stride_head,
                out_stride_token,
                out_stride_head,
                weights_stride,
                weights_out_stride,
                table_stride,
                max_pos,
                num_tokens,
                num_heads,
                positions_i64,
                format,
                weight_scale,
                reserved
            }
        ),
        mirror!(
            "ukv_indexer_k_params",
            IndexerKParams {
                key,
                norm_weight,
                table,
                positions,
                loc,
                cache,
                key_stride,
                table_stride,
                max_pos,
                bytes_per_page,
                token_slots,
                page_shift,
                num_tokens,
                key_f32,
                positions_i64,
                loc_i64,
                format,
                eps,
                reserved
            }
        ),
        mirror!(
            "ukv_indexer_topk_params",
            IndexerTopkParams {
                q_fp8,
                weights,
                cache,
                page_table,
                batch_id,
                positions,
                logits,
                topk_indices,
                q_stride_token,
                q_stride_head,
                weights_stride,
                page_table_stride,
                logits_stride,
                topk_stride,
                bytes_per_page,
                cache_pages,
                requests,
                max_pages,
                logits_width,
                topk_width,
                num_tokens,
                num_heads,
                topk,
                positions_i64,
                format,
                score,
                csa_indices,
                csa_indptr,
                csa_capacity,
                csa_window,
                csa_row_base,
                csa_rows,
                csa_reserved
            }
        ),
        mirror!(
            "ukv_compress_params",
            CompressParams {
                kv_score,
                ape,
                norm_weight,
                rope_table,
                batch_id,
                req_slots,
                positions,
                loc,
                state,
                cache,
                pool,
                kv_stride,
                ape_stride,
                table_stride,
                max_pos,
                capacity,
                swa_rows,
                bytes_per_page,
                page_shift,
                num_tokens,
                num_requests,
                num_slots,
                ring,
                ratio,
                dim,
                target,
                prefill,
                kv_f32,
                weight_f32,
                positions_i64,
                loc_i64,
                format,
                eps,
                reserved
            }
        ),
        mirror!(
            "ukv_compress_clear_params",
            CompressClearParams {
                rows,
                num_rows,
                row_floats,
                reserved
            }
        ),
    ]
}

/// The C table grouped by struct: name -> (size, fields in order).
fn c_layouts() -> BTreeMap<String, (usize, Vec<ParamField>)> {
    let mut structs: BTreeMap<String, (usize, Vec<ParamField>)> = BTreeMap::new();
    for field in param_layout() {
        let entry = structs
            .entry(field.ty.clone())
            .or_insert_with(|| (field.type_size, Vec::new()));
        entry.1.push(field);
    }
    structs
}

#[test]
fn every_field_matches_the_c_layout() {
    let c = c_layouts();
    let rust = rust_layouts();
    let mut wrong = Vec::new();
    for (name, size, fields) in &rust {
        let Some((c_size, c_fields)) = c.get(*name) else {
            wrong.push(format!("{name}: missing from the C table"));
            continue;
        };
        if size != c_size {
            wrong.push(format!("{name}: {size} bytes in Rust, {c_size} in C"));
        }
        if fields.len() != c_fields.len() {
            wrong.push(format!(
                "{name}: {} fields in Rust, {} in C",
                fields.len(),
                c_fields.len()
            ));
        }
        for &(field, offset, size) in fields {
            match c_fields.iter().find(|f| f.field == field) {
                None => wrong.push(format!("{name}.{field}: not a field in C")),
                Some(f) if (f.offset, f.size) != (offset, size) => wrong.push(format!(
                    "{name}.{field}: offset {offset} size {size} in Rust, offset {} size {} in C",
                    f.offset, f.size
                )),
                Some(_) => {}
            }
        }
    }
    for name in c.keys() {
        if !rust.iter().any(|(n, ..)| n == name) {
            wrong.push(format!("{name}: no Rust mirror listed in this test"));
        }
    }
    assert!(
        wrong.is_empty(),
        "kernels/params.h and its mirror in src/backend/gpu/shim.rs disagree:\n{}",
        wrong.join("\n")
    );
}

/// The C table lists every struct params.h declares (its static_asserts
/// then make it list every field of each).
#[test]
fn the_c_table_covers_params_h() {
    let header = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/kernels/params.h"))
        .expect("kernels/params.h");
    let declared: BTreeSet<String> = header
        .split("typedef struct ")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next())
        .map(String::from)
        .collect();
    let listed: BTreeSet<String> = c_layouts().into_keys().collect();
    assert_eq!(declared, listed);
}
