/* fp32 GEMM shapes, 1 thread: gcc -O3 -march=native -DNR=6 gemm_shapes.c && taskset -c 1 ./a.out
   (the block kernels keep one FMA chain per row and column; this asks what the load pattern allows on this core).
   A: one weight column x NR rows of x, 512-bit; E: two columns x NR rows (half the loads of x a FMA);
   Y: one column x NR rows, 256-bit; R: the FMAs alone, on registers (the core's peak). */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define K 576
#ifndef NCOL
#define NCOL 256
#endif
#ifndef NR
#define NR 6
#endif
__attribute__((noinline)) void kA(const float*W,const float*x,float*y){
  for(int o=0;o<NCOL;o++){ const float*w=W+(size_t)o*K;
    __m512 lo[NR],hi[NR]; for(int r=0;r<NR;r++){lo[r]=_mm512_setzero_ps();hi[r]=_mm512_setzero_ps();}
    for(int c=0;c<K;c+=32){ __m512 wl=_mm512_loadu_ps(w+c), wh=_mm512_loadu_ps(w+c+16);
      for(int r=0;r<NR;r++){ lo[r]=_mm512_fmadd_ps(wl,_mm512_loadu_ps(x+r*K+c),lo[r]); hi[r]=_mm512_fmadd_ps(wh,_mm512_loadu_ps(x+r*K+c+16),hi[r]); } }
    for(int r=0;r<NR;r++) y[r*NCOL+o]=_mm512_reduce_add_ps(_mm512_add_ps(lo[r],hi[r])); } }
__attribute__((noinline)) void kE(const float*W,const float*x,float*y){
  for(int o=0;o<NCOL;o+=2){ const float*w0=W+(size_t)o*K,*w1=w0+K;
    __m512 a[NR],b[NR],c_[NR],d[NR]; for(int r=0;r<NR;r++){a[r]=b[r]=c_[r]=d[r]=_mm512_setzero_ps();}
    for(int c=0;c<K;c+=32){ __m512 wl0=_mm512_loadu_ps(w0+c), wh0=_mm512_loadu_ps(w0+c+16), wl1=_mm512_loadu_ps(w1+c), wh1=_mm512_loadu_ps(w1+c+16);
      for(int r=0;r<NR;r++){ __m512 xl=_mm512_loadu_ps(x+r*K+c), xh=_mm512_loadu_ps(x+r*K+c+16);
        a[r]=_mm512_fmadd_ps(wl0,xl,a[r]); b[r]=_mm512_fmadd_ps(wh0,xh,b[r]); c_[r]=_mm512_fmadd_ps(wl1,xl,c_[r]); d[r]=_mm512_fmadd_ps(wh1,xh,d[r]); } }
    for(int r=0;r<NR;r++){ y[r*NCOL+o]=_mm512_reduce_add_ps(_mm512_add_ps(a[r],b[r])); y[r*NCOL+o+1]=_mm512_reduce_add_ps(_mm512_add_ps(c_[r],d[r]));} } }
__attribute__((noinline)) void kY(const float*W,const float*x,float*y){
  for(int o=0;o<NCOL;o++){ const float*w=W+(size_t)o*K;
    __m256 a[NR][4]; for(int r=0;r<NR;r++)for(int k=0;k<4;k++)a[r][k]=_mm256_setzero_ps();
    for(int c=0;c<K;c+=32){ __m256 w0=_mm256_loadu_ps(w+c),w1=_mm256_loadu_ps(w+c+8),w2=_mm256_loadu_ps(w+c+16),w3=_mm256_loadu_ps(w+c+24);
      for(int r=0;r<NR;r++){ const float*xr=x+r*K+c; a[r][0]=_mm256_fmadd_ps(w0,_mm256_loadu_ps(xr),a[r][0]); a[r][1]=_mm256_fmadd_ps(w1,_mm256_loadu_ps(xr+8),a[r][1]); a[r][2]=_mm256_fmadd_ps(w2,_mm256_loadu_ps(xr+16),a[r][2]); a[r][3]=_mm256_fmadd_ps(w3,_mm256_loadu_ps(xr+24),a[r][3]);} }
    for(int r=0;r<NR;r++){ __m256 s=_mm256_add_ps(_mm256_add_ps(a[r][0],a[r][1]),_mm256_add_ps(a[r][2],a[r][3])); __m128 q=_mm_add_ps(_mm256_castps256_ps128(s),_mm256_extractf128_ps(s,1)); q=_mm_hadd_ps(q,q); q=_mm_hadd_ps(q,q); y[r*NCOL+o]=_mm_cvtss_f32(q);} } }
__attribute__((noinline)) void kR(const float*W,const float*x,float*y){
  __m512 acc[16]; for(int i=0;i<16;i++)acc[i]=_mm512_set1_ps(i*1e-9f); __m512 w=_mm512_set1_ps(1.0000001f), v=_mm512_set1_ps(0.999999f);
  for(int o=0;o<NCOL;o++) for(int c=0;c<K;c+=32) for(int i=0;i<NR*2;i++) acc[i%16]=_mm512_fmadd_ps(w,acc[i%16],v);
  __m512 s=acc[0]; for(int i=1;i<16;i++) s=_mm512_add_ps(s,acc[i]); y[0]=_mm512_reduce_add_ps(s); (void)W; (void)x;}
int main(){ float*W=aligned_alloc(64,sizeof(float)*K*NCOL),*x=aligned_alloc(64,sizeof(float)*K*8),*y=aligned_alloc(64,sizeof(float)*8*NCOL);
  for(size_t i=0;i<(size_t)K*NCOL;i++)W[i]=(rand()%100)/100.f; for(int i=0;i<K*8;i++)x[i]=(rand()%100)/100.f;
  void(*f[4])(const float*,const float*,float*)={kA,kE,kY,kR}; const char*n[4]={"A zmm","E 2 columns","Y ymm","R registers"};
  for(int rep=0;rep<3;rep++) for(int k=0;k<4;k++){ double best=1e9; for(int it=0;it<50;it++){double t=now(); f[k](W,x,y); t=now()-t; if(t<best)best=t;}
    printf("%s x%d: %.4f ms, %.1f GFLOP/s\n",n[k],NR,best*1e3, 2.0*K*NCOL*NR/best/1e9);} }
