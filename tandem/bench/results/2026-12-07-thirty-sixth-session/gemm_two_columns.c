/* one column x NR rows against two columns x NR rows of fp32 weights: gcc -O3 -march=native -DNCOL=256 gemm_two_columns.c */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define K 576
#ifndef NCOL
#define NCOL 1536
#endif
#define NR 6
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
int main(){ float*W=aligned_alloc(64,sizeof(float)*K*NCOL),*x=aligned_alloc(64,sizeof(float)*K*8),*y=aligned_alloc(64,sizeof(float)*8*NCOL);
  for(size_t i=0;i<(size_t)K*NCOL;i++)W[i]=(rand()%100)/100.f; for(int i=0;i<K*8;i++)x[i]=(rand()%100)/100.f;
  void(*f[2])(const float*,const float*,float*)={kA,kE}; const char*n[2]={"A 1col","E 2col"};
  for(int rep=0;rep<3;rep++) for(int k=0;k<2;k++){ double best=1e9; for(int it=0;it<50;it++){double t=now(); f[k](W,x,y); t=now()-t; if(t<best)best=t;}
    printf("%s x%d: %.3f ms, %.1f GFLOP/s\n",n[k],NR,best*1e3, 2.0*K*NCOL*NR/best/1e9);} }
