#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  __m512 a[12]; __m512 b=_mm512_set1_ps(1.0000001f), c=_mm512_set1_ps(1e-9f);
  for(int i=0;i<12;i++) a[i]=_mm512_set1_ps(i);
  long n=200000000; double best=0;
  for(int rep=0;rep<5;rep++){
    double t0=now();
    for(long i=0;i<n/12;i++){ for(int k=0;k<12;k++) a[k]=_mm512_fmadd_ps(a[k],b,c); }
    double t=now()-t0; double gf=(double)(n/12)*12*32/t/1e9; if(gf>best)best=gf;
  }
  float s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_ps(a[i]);
  printf("fp32 FMA peak, 1 thread, 512-bit: %.1f GFLOP/s (sink %g)\n",best,s);
  __m256 d[12]; __m256 e=_mm256_set1_ps(1.0000001f), f=_mm256_set1_ps(1e-9f);
  for(int i=0;i<12;i++) d[i]=_mm256_set1_ps(i); best=0;
  for(int rep=0;rep<5;rep++){
    double t0=now();
    for(long i=0;i<n/12;i++){ for(int k=0;k<12;k++) d[k]=_mm256_fmadd_ps(d[k],e,f); }
    double t=now()-t0; double gf=(double)(n/12)*12*16/t/1e9; if(gf>best)best=gf;
  }
  s=0; for(int i=0;i<12;i++){float v[8];_mm256_storeu_ps(v,d[i]);for(int j=0;j<8;j++)s+=v[j];}
  printf("fp32 FMA peak, 1 thread, 256-bit: %.1f GFLOP/s (sink %g)\n",best,s);
}
