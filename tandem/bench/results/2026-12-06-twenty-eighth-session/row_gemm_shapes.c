/* fp32 weights, 8 rows of x: one output x 8 rows (the kernel's structure), 2 outputs x 4 rows, 4 x 2, and
   one x 8 with the inner dimension split in K-blocks (accumulators kept in memory between them). Every
   variant sums each (row, output) chain as the kernel does: the bits are compared.
   gcc -O3 -march=native -ffp-contract=off row_gemm_shapes.c -o g && ./g INNER OUT KBLOCK_CHUNKS */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
/* current: one output, N rows, lo/hi per row */
static __attribute__((noinline)) void k1(int N,const float*x,int inner,const float*w,float*y,int ldy,int o){
  __m512 lo[8],hi[8];
  for(int r=0;r<8;r++){lo[r]=_mm512_setzero_ps();hi[r]=_mm512_setzero_ps();}
  for(int b=0;b<inner/32;b++){
    __m512 wl=_mm512_loadu_ps(w+b*32), wh=_mm512_loadu_ps(w+b*32+16);
    #pragma GCC unroll 8
    for(int r=0;r<8;r++){const float*xr=x+r*inner+b*32;
      lo[r]=_mm512_fmadd_ps(wl,_mm512_loadu_ps(xr),lo[r]); hi[r]=_mm512_fmadd_ps(wh,_mm512_loadu_ps(xr+16),hi[r]);}
  }
  for(int r=0;r<8;r++) y[r*ldy+o]=_mm512_reduce_add_ps(_mm512_add_ps(lo[r],hi[r]));
}
/* two outputs, 4 rows */
static __attribute__((noinline)) void k2(const float*x,int inner,const float*w0,const float*w1,float*y,int ldy,int o){
  __m512 lo0[4],hi0[4],lo1[4],hi1[4];
  for(int r=0;r<4;r++){lo0[r]=hi0[r]=lo1[r]=hi1[r]=_mm512_setzero_ps();}
  for(int b=0;b<inner/32;b++){
    __m512 a=_mm512_loadu_ps(w0+b*32), bb=_mm512_loadu_ps(w0+b*32+16);
    __m512 c=_mm512_loadu_ps(w1+b*32), d=_mm512_loadu_ps(w1+b*32+16);
    #pragma GCC unroll 4
    for(int r=0;r<4;r++){const float*xr=x+r*inner+b*32; __m512 xl=_mm512_loadu_ps(xr), xh=_mm512_loadu_ps(xr+16);
      lo0[r]=_mm512_fmadd_ps(a,xl,lo0[r]); hi0[r]=_mm512_fmadd_ps(bb,xh,hi0[r]);
      lo1[r]=_mm512_fmadd_ps(c,xl,lo1[r]); hi1[r]=_mm512_fmadd_ps(d,xh,hi1[r]);}
  }
  for(int r=0;r<4;r++){ y[r*ldy+o]=_mm512_reduce_add_ps(_mm512_add_ps(lo0[r],hi0[r])); y[r*ldy+o+1]=_mm512_reduce_add_ps(_mm512_add_ps(lo1[r],hi1[r]));}
}
/* four outputs, 2 rows */
static __attribute__((noinline)) void k4(const float*x,int inner,const float*w,int ldw,float*y,int ldy,int o){
  __m512 lo[4][2],hi[4][2];
  for(int q=0;q<4;q++)for(int r=0;r<2;r++){lo[q][r]=hi[q][r]=_mm512_setzero_ps();}
  for(int b=0;b<inner/32;b++){
    __m512 xl0=_mm512_loadu_ps(x+b*32), xh0=_mm512_loadu_ps(x+b*32+16);
    __m512 xl1=_mm512_loadu_ps(x+inner+b*32), xh1=_mm512_loadu_ps(x+inner+b*32+16);
    #pragma GCC unroll 4
    for(int q=0;q<4;q++){ __m512 wl=_mm512_loadu_ps(w+q*ldw+b*32), wh=_mm512_loadu_ps(w+q*ldw+b*32+16);
      lo[q][0]=_mm512_fmadd_ps(wl,xl0,lo[q][0]); hi[q][0]=_mm512_fmadd_ps(wh,xh0,hi[q][0]);
      lo[q][1]=_mm512_fmadd_ps(wl,xl1,lo[q][1]); hi[q][1]=_mm512_fmadd_ps(wh,xh1,hi[q][1]);}
  }
  for(int q=0;q<4;q++)for(int r=0;r<2;r++) y[r*ldy+o+q]=_mm512_reduce_add_ps(_mm512_add_ps(lo[q][r],hi[q][r]));
}

/* one output, 8 rows, inner split in K-blocks with accumulators kept in memory between them */
static __attribute__((noinline)) void k1b(const float*x,int inner,const float*w,int b0,int b1,__m512*acc,int last,float*y,int ldy,int o){
  __m512 lo[8],hi[8];
  for(int r=0;r<8;r++){lo[r]=acc[2*r];hi[r]=acc[2*r+1];}
  for(int b=b0;b<b1;b++){
    __m512 wl=_mm512_loadu_ps(w+b*32), wh=_mm512_loadu_ps(w+b*32+16);
    #pragma GCC unroll 8
    for(int r=0;r<8;r++){const float*xr=x+r*inner+b*32;
      lo[r]=_mm512_fmadd_ps(wl,_mm512_loadu_ps(xr),lo[r]); hi[r]=_mm512_fmadd_ps(wh,_mm512_loadu_ps(xr+16),hi[r]);}
  }
  if(last){for(int r=0;r<8;r++) y[r*ldy+o]=_mm512_reduce_add_ps(_mm512_add_ps(lo[r],hi[r]));}
  else for(int r=0;r<8;r++){acc[2*r]=lo[r];acc[2*r+1]=hi[r];}
}
int main(int argc,char**argv){
  int inner=atoi(argv[1]), out=atoi(argv[2]), n=8, reps=200;
  float*x=aligned_alloc(64,4*n*inner), *w=aligned_alloc(64,4L*out*inner), *y1=calloc(n*out,4), *y2=calloc(n*out,4), *y4=calloc(n*out,4);
  for(long i=0;i<(long)n*inner;i++)x[i]=(rand()%1000)/500.0f-1; for(long i=0;i<(long)out*inner;i++)w[i]=(rand()%1000)/500.0f-1;
  double best1=1e9,best2=1e9,best4=1e9;
  for(int rep=0;rep<reps;rep++){
    double t=now(); for(int o=0;o<out;o++) k1(8,x,inner,w+(long)o*inner,y1,out,o); t=now()-t; if(t<best1)best1=t;
    t=now(); for(int g=0;g<2;g++) for(int o=0;o<out;o+=2) k2(x+g*4*inner,inner,w+(long)o*inner,w+(long)(o+1)*inner,y2+g*4*out,out,o); t=now()-t; if(t<best2)best2=t;
    t=now(); for(int g=0;g<4;g++) for(int o=0;o<out;o+=4) k4(x+g*2*inner,inner,w+(long)o*inner,inner,y4+g*2*out,out,o); t=now()-t; if(t<best4)best4=t;
  }
  float*yb=calloc(n*out,4); double bestb=1e9; int KB=atoi(argv[3]); __m512 *acc=aligned_alloc(64,64*16*16);
  for(int rep=0;rep<reps;rep++){ double t=now();
    for(int t0=0;t0<out;t0+=16){ for(int i=0;i<16*16;i++)acc[i]=_mm512_setzero_ps();
      for(int b0=0;b0<inner/32;b0+=KB){int b1=b0+KB<inner/32?b0+KB:inner/32;
        for(int o=t0;o<t0+16&&o<out;o++) k1b(x,inner,w+(long)o*inner,b0,b1,acc+(o-t0)*16,b1==inner/32,yb,out,o);}}
    t=now()-t; if(t<bestb)bestb=t;}
  double fl=2.0*n*inner*out;
  printf("K-blocked (%d chunks) %.1f GFLOP/s same bits %d\n", KB, fl/bestb/1e9, !memcmp(y1,yb,4*n*out));
  printf("inner %d out %d: 1x8 %.1f GFLOP/s, 2x4 %.1f, 4x2 %.1f; same bits %d %d\n",inner,out,fl/best1/1e9,fl/best2/1e9,fl/best4/1e9, !memcmp(y1,y2,4*n*out), !memcmp(y1,y4,4*n*out));
}
