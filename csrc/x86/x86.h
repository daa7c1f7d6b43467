/*
 * x86.h - the x86 tiers' kernel tables, each file's, indexed by weight type (NULL where it has no kernel of that type);
 * backends_x86.c makes the avx2, avx512 and avx512_vnni backends of them. Defined only on x86-64 with GCC or clang.
 */
#ifndef PYLLM_X86_H
#define PYLLM_X86_H

#include "backend/kernel_set.h"

/* The 256-bit kernels of vec_dot_avx2_*.inc, built twice: every shape but the panels and tiles. */
typedef struct {
    const vec_dot_fn *vec_dot;
    const vec_dot_rows_fn *rows4, *rows8;
    const vec_dot_prepared_fn *prepared;
    const vec_dot_cols_fn *cols4;
} avx2_family;

extern const avx2_family family_avx2;       /* vec_dot_avx2.c: int8 dots by vpmaddubsw + vpmaddwd */
extern const avx2_family family_avx2_vnni;  /* vec_dot_avx2_vnni.c: the same by vpdpbusd / vpdpwssd */

extern const vec_dot_fn vec_dot_table_avx512[PYLLM_TYPE_COUNT];  /* vec_dot_avx512.c: Q2_K, Q3_K, Q5_K, Q6_K */

/* panel_avx512_vnni.c: a prompt's rows 16 at a time */
extern const panel_prepare_fn panel_prepare_avx512_vnni;
extern const panel_unpack_fn panel_unpack_table_avx512_vnni[PYLLM_TYPE_COUNT];
extern const panel_kernel_fn panel_kernel_table_avx512_vnni[PYLLM_TYPE_COUNT];

/* tile_avx2.c: the tile kernels of Q4_K_X16 and Q6_K_X16 */
extern const tile_kernel_fn tile_kernel_table_avx2[PYLLM_TYPE_COUNT];

/* tile_avx512_vnni.c: the tiled layouts' 16 rows a vector */
extern const tile_kernel_fn tile_kernel_table_avx512_vnni[PYLLM_TYPE_COUNT];

extern const op_kernels op_kernels_avx2;                         /* ops_avx2.c */
extern const prompt_attention_kernels prompt_attention_avx512;   /* ops_avx512.c */
extern const head_group_kernels head_group_avx512;               /* ops_avx512.c */

#endif /* PYLLM_X86_H */
